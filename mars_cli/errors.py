"""The one exception type that the CLI turns into a single line on stderr and exit code 2."""


class UserError(Exception):
    """Bad input or an unusable environment: the message is shown to the user as is."""


def require(condition: bool, message: str) -> None:
    """Raise a UserError with `message` unless `condition` holds."""
    if not condition:
        raise UserError(message)
