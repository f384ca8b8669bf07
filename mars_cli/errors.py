"""The one exception type that the CLI turns into a single line on stderr and exit code 2."""


class UserError(Exception):
    """Bad input or an unusable environment: the message is shown to the user as is."""


class StaticCacheFull(UserError):
    """A sequence needs more positions than the static cache (the compiled forwards') holds. The
    core says what happened; the CLI adds what to do about it."""


def require(condition: bool, message: str) -> None:
    """Raise a UserError with `message` unless `condition` holds."""
    if not condition:
        raise UserError(message)


SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1  # torch takes [-2**63, 2**64 - 1]; derived seeds add offsets


def check_seed(seed: int | None, flag: str = "--seed") -> None:
    """Refuse a seed torch would reject (with a traceback) when a generator is seeded, leaving room
    for the offsets added to it (the drafter's seed + 1, calibration's seed + call number)."""
    require(seed is None or SEED_MIN <= seed <= SEED_MAX,
            f"{flag} must be an integer between {SEED_MIN} and {SEED_MAX}, got {seed}")


# What torch raises when a kernel a probe tries is missing or refuses its input on this machine:
# a probe catches these and returns its refusal as one line (the kernel is then not used).
KERNEL_FAILURES = (RuntimeError, NotImplementedError, TypeError, ValueError)


def first_line(error: BaseException) -> str:
    """An exception's message cut to its first line (what a one-line error shows), or its type's name."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
