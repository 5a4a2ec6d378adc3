#!/usr/bin/env python3
"""Appends DuckDB's extension metadata footer to a built shared library.

DuckDB reads the last 512 bytes of a loadable extension: eight 32-byte NUL-padded fields
(stored in reverse: three unused, ABI type, extension version, C API version, platform,
magic "4") followed by a 256-byte signature (zeros: unsigned). They are preceded by a 22-byte
WebAssembly custom-section header so the same layout works for WASM builds.

usage: append_footer.py <input .so> <output .duckdb_extension> <platform> <extension version>
                        [<C API version>, default v1.5.6]
"""
import shutil
import sys

ABI_TYPE = "C_STRUCT"
C_API_VERSION = "v1.5.6"


def field(text: str) -> bytes:
    raw = text.encode("ascii")
    if len(raw) > 32:
        raise SystemExit(f"footer field too long: {text!r}")
    return raw.ljust(32, b"\0")


def main() -> None:
    if len(sys.argv) not in (5, 6):
        raise SystemExit(__doc__)
    src, dst, platform, version = sys.argv[1:5]
    c_api = sys.argv[5] if len(sys.argv) == 6 else C_API_VERSION
    footer = b"\x00\x93\x04\x10" + b"duckdb_signature" + b"\x80\x04"
    for text in ("", "", "", ABI_TYPE, version, c_api, platform, "4"):
        footer += field(text)
    footer += b"\0" * 256
    assert len(footer) == 534
    tmp = dst + ".tmp"
    shutil.copyfile(src, tmp)
    with open(tmp, "ab") as f:
        f.write(footer)
    shutil.move(tmp, dst)


if __name__ == "__main__":
    main()
