"""Numbers for people: 12345 -> '12.3K' (badges, tables)."""


def human(n: float, digits: int = 3) -> str:
    """Parameter and FLOP counts with a K/M/G/T/P suffix and `digits` significant digits."""
    for unit in ("", "K", "M", "G", "T", "P"):
        if abs(n) < 1000:
            return f"{n:.0f}{unit}" if unit == "" else f"{n:.{digits}g}{unit}"
        n /= 1000
    return f"{n:.{digits}g}E"
