"""The decoding core shared by generate, calibrate, profile and eval."""
