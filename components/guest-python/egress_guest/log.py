"""Log lines through the contract's `log` import; the host adds the provider, its version, the
operation and the proxy's name. Never log a secret: the provider holds none, keep it that way."""

from wit_world.imports import log as _wit_log


def log(level: str, message: str, **fields) -> None:
    """Emit one line at `level` (trace, debug, info, warn, error) with `fields` as text."""
    _wit_log.emit(_wit_log.Level[level.upper()], message, [_wit_log.Field(k, str(v)) for k, v in fields.items()])


def debug(message: str, **fields) -> None:
    """`log("debug", ...)`."""
    log("debug", message, **fields)


def info(message: str, **fields) -> None:
    """`log("info", ...)`."""
    log("info", message, **fields)


def warn(message: str, **fields) -> None:
    """`log("warn", ...)`."""
    log("warn", message, **fields)
