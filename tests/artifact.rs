//! The library file cargo builds beside these tests (`libstreaming_etl.so`, which `make release`
//! gives DuckDB's footer): it exports the entrypoint DuckDB's loader calls for `LOAD
//! streaming_etl` and no other, and it holds none of the fault-injection hooks (a feature of
//! `tools/fault-extension` only).
//!
//! Being an integration test, this also makes `cargo test` build the library as `cargo build`
//! does, so that the two share their dependencies' artifacts (docs/development.md).

use std::path::PathBuf;

/// The cdylib cargo built for this test run: `target/<profile>/libstreaming_etl.so`.
fn library() -> Vec<u8> {
    let exe = std::env::current_exe().expect("the test's own path");
    let dir: PathBuf = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps")
        .to_path_buf();
    std::fs::read(dir.join("libstreaming_etl.so"))
        .expect("cargo builds the cdylib before the tests")
}

fn u16_at(b: &[u8], at: usize) -> usize {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap()) as usize
}

fn u32_at(b: &[u8], at: usize) -> usize {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize
}

fn u64_at(b: &[u8], at: usize) -> usize {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize
}

/// The names of the functions an ELF64 little-endian shared object defines and exports (its
/// `.dynsym` entries that are global or weak and defined in a section).
fn exported_functions(elf: &[u8]) -> Vec<String> {
    assert_eq!(&elf[..4], b"\x7fELF", "an ELF file");
    assert_eq!((elf[4], elf[5]), (2, 1), "ELF64, little-endian");
    let (shoff, shentsize, shnum) = (u64_at(elf, 0x28), u16_at(elf, 0x3a), u16_at(elf, 0x3c));
    let section = |i: usize| shoff + i * shentsize;
    let mut names = Vec::new();
    for i in 0..shnum {
        let sh = section(i);
        const SHT_DYNSYM: usize = 11;
        if u32_at(elf, sh + 4) != SHT_DYNSYM {
            continue;
        }
        let (offset, size, link, entsize) = (
            u64_at(elf, sh + 0x18),
            u64_at(elf, sh + 0x20),
            u32_at(elf, sh + 0x28),
            u64_at(elf, sh + 0x38),
        );
        let strtab = u64_at(elf, section(link) + 0x18);
        for s in (offset..offset + size).step_by(entsize) {
            let (info, shndx) = (elf[s + 4], u16_at(elf, s + 6));
            let (binding, kind) = (info >> 4, info & 0xf);
            const STB_GLOBAL: u8 = 1;
            const STB_WEAK: u8 = 2;
            const STT_FUNC: u8 = 2;
            if kind != STT_FUNC || shndx == 0 || !matches!(binding, STB_GLOBAL | STB_WEAK) {
                continue;
            }
            let name = &elf[strtab + u32_at(elf, s)..];
            let end = name.iter().position(|&c| c == 0).unwrap();
            names.push(String::from_utf8_lossy(&name[..end]).into_owned());
        }
    }
    names
}

#[test]
fn the_library_exports_the_one_entrypoint_duckdbs_loader_calls() {
    let exported = exported_functions(&library());
    let entrypoints: Vec<&String> = exported
        .iter()
        .filter(|n| n.ends_with("_init_c_api") || n.ends_with("_init_c_api_v2"))
        .collect();
    assert_eq!(entrypoints, ["streaming_etl_init_c_api"]);
}

#[test]
fn the_library_holds_no_fault_injection_hooks() {
    let lib = library();
    for hook in [&b"STREAMING_ETL_CRASH_AT"[..], b"STREAMING_ETL_PANIC_AT"] {
        assert!(
            !lib.windows(hook.len()).any(|w| w == hook),
            "{}",
            String::from_utf8_lossy(hook)
        );
    }
}
