# Types of the optional C extension built from _c/pairsums.c (see opscope.compare.kernel).

SIMD: int

def sums(a: int, a_code: int, b: int, b_code: int, n: int, rel_floor: float, rtol: float, /) -> tuple[
    float, float, float, float, float, float, float, float, float, int]: ...
def set_simd(on: bool, /) -> bool: ...
def stream(fd_a: int, offset_a: int, a_code: int, fd_b: int, offset_b: int, b_code: int, n: int, block: int,
           buf_a: int, buf_b: int, rel_floor: float, rtol: float, /) -> tuple[
    list[tuple[float, float, float, float, float, float, float, float, float, int]], int, int]: ...
