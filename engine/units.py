"""Numbers for people: 12345 -> '12.3K' (badges, tables)."""


def human(n: float, digits: int = 3) -> str:
    """Parameter and FLOP counts with a K/M/G/T/P suffix and `digits` significant digits."""
    for unit in ("", "K", "M", "G", "T", "P"):
        if abs(n) < 1000:
            return f"{n:.0f}{unit}" if unit == "" else f"{n:.{digits}g}{unit}"
        n /= 1000
    return f"{n:.{digits}g}E"


def gib(n: float) -> str:
    """Bytes as GiB, MiB or KiB (plans, memory errors)."""
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    if n >= 2**20:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 2**10:.1f} KiB"
