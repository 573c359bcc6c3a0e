//! The kernel modules the guest loads: found in the unpacked kernel package, decompressed,
//! and ordered by the dependencies their `.modinfo` sections name.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::elf::elf_section;

/// Kernel modules the guest loads, with parameters. Their dependencies come from each
/// module's modinfo `depends=` and are loaded first; built-in ones are skipped.
const MODULES: &[(&str, &str)] = &[
    // rxe computes the RoCEv2 ICRC with the crypto API's "crc32", which nothing would
    // modprobe for it here.
    ("crc32_generic", ""),
    ("rdma_rxe", ""),
    // the rdma_cm stack: rping, perftest -R, the library's rdma_cm endpoints
    ("configfs", ""),
    ("ib_cm", ""),
    ("iw_cm", ""),
    ("rdma_cm", ""),
    ("rdma_ucm", ""),
    // dummy0, the guest-only netdev under rxe0
    ("dummy", "numdummies=1"),
    // the 9p host share
    ("virtio_pci", ""),
    ("9pnet_virtio", ""),
    ("9p", ""),
];

/// One module for the guest: its name, where it came from, its (decompressed) contents.
pub(super) struct Module {
    pub(super) name: String,
    pub(super) params: String,
    pub(super) source: PathBuf,
    pub(super) data: Vec<u8>,
}

/// The modules of [`MODULES`] and everything they depend on, in load order.
pub(super) fn kernel_modules(modules_dir: &Path) -> Result<Vec<Module>, String> {
    let mut index = BTreeMap::new();
    index_modules(&modules_dir.join("kernel"), &mut index)?;
    let builtin: BTreeSet<String> = fs::read_to_string(modules_dir.join("modules.builtin"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.rsplit('/').next().and_then(module_name))
        .collect();
    let mut loaded: BTreeMap<String, (PathBuf, Vec<u8>)> = BTreeMap::new();
    let roots: Vec<&str> = MODULES.iter().map(|(m, _)| *m).collect();
    let order = load_order(&roots, |name| {
        if builtin.contains(name) {
            return Ok(None);
        }
        let path = index.get(name).ok_or_else(|| {
            format!(
                "kernel module {name} is neither in {} nor built in",
                modules_dir.display()
            )
        })?;
        let data = read_module(path)?;
        let section = elf_section(&data, ".modinfo")
            .ok_or_else(|| format!("{}: no .modinfo section", path.display()))?;
        let deps = modinfo_depends(section);
        loaded.insert(name.to_string(), (path.clone(), data));
        Ok(Some(deps))
    })?;
    Ok(order
        .into_iter()
        .map(|name| {
            let (source, data) = loaded
                .remove(&name)
                .expect("load_order only returns loaded modules");
            let params = MODULES
                .iter()
                .find(|(m, _)| *m == name)
                .map_or("", |(_, p)| *p)
                .to_string();
            Module {
                name,
                params,
                source,
                data,
            }
        })
        .collect())
}

/// Maps module names to files for every module below `dir`.
fn index_modules(dir: &Path, index: &mut BTreeMap<String, PathBuf>) -> Result<(), String> {
    for entry in fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = entry.path();
        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            index_modules(&path, index)?;
        } else if let Some(name) = module_name(&entry.file_name().to_string_lossy()) {
            index.insert(name, path);
        }
    }
    Ok(())
}

/// The module name of a module file (`9pnet_virtio.ko.xz` -> `9pnet_virtio`); the kernel
/// treats `-` and `_` alike and so does this.
fn module_name(file: &str) -> Option<String> {
    let stem = [".ko", ".ko.xz", ".ko.zst", ".ko.gz"]
        .iter()
        .find_map(|ext| file.strip_suffix(ext))?;
    (!stem.is_empty()).then(|| stem.replace('-', "_"))
}

/// A module's contents, decompressed (Debian 6.1 ships plain .ko; newer kernels .ko.xz).
fn read_module(path: &Path) -> Result<Vec<u8>, String> {
    let name = path.to_string_lossy();
    let tool = [
        (".xz", "xz", "xz-utils"),
        (".zst", "zstd", "zstd"),
        (".gz", "gzip", "gzip"),
    ]
    .into_iter()
    .find(|(ext, _, _)| name.ends_with(ext));
    match tool {
        None => fs::read(path).map_err(|e| format!("{}: {e}", path.display())),
        Some((_, program, package)) => {
            let out = Command::new(program)
                .arg("-dc")
                .arg(path)
                .output()
                .map_err(|e| {
                    format!("{program} (Debian package {package}) to unpack {name}: {e}")
                })?;
            if !out.status.success() {
                return Err(format!("{program} -dc {name} failed ({})", out.status));
            }
            Ok(out.stdout)
        }
    }
}

/// The `depends=` list of a `.modinfo` section (NUL-separated `key=value` strings).
fn modinfo_depends(modinfo: &[u8]) -> Vec<String> {
    modinfo
        .split(|&b| b == 0)
        .filter_map(|kv| kv.strip_prefix(b"depends="))
        .flat_map(|v| v.split(|&b| b == b','))
        .filter(|d| !d.is_empty())
        .map(|d| String::from_utf8_lossy(d).replace('-', "_"))
        .collect()
}

/// `roots` and their dependencies, every module after the ones it depends on, each once.
/// `deps(name)` is `None` for a module that needs no loading (built in).
fn load_order<F>(roots: &[&str], mut deps: F) -> Result<Vec<String>, String>
where
    F: FnMut(&str) -> Result<Option<Vec<String>>, String>,
{
    fn visit<F>(
        name: &str,
        deps: &mut F,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
        order: &mut Vec<String>,
    ) -> Result<(), String>
    where
        F: FnMut(&str) -> Result<Option<Vec<String>>, String>,
    {
        if done.contains(name) {
            return Ok(());
        }
        if path.iter().any(|p| p == name) {
            path.push(name.to_string());
            return Err(format!("module dependency cycle: {}", path.join(" -> ")));
        }
        let Some(list) = deps(name)? else {
            done.insert(name.to_string());
            return Ok(());
        };
        path.push(name.to_string());
        for dep in &list {
            visit(dep, deps, done, path, order)?;
        }
        path.pop();
        done.insert(name.to_string());
        order.push(name.to_string());
        Ok(())
    }
    let (mut done, mut path, mut order) = (BTreeSet::new(), Vec::new(), Vec::new());
    for root in roots {
        visit(root, &mut deps, &mut done, &mut path, &mut order)?;
    }
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rxe::elf::elf_is_static;

    #[test]
    fn module_names_and_load_order() {
        assert_eq!(module_name("rdma_rxe.ko").as_deref(), Some("rdma_rxe"));
        assert_eq!(
            module_name("9pnet_virtio.ko.xz").as_deref(),
            Some("9pnet_virtio")
        );
        assert_eq!(
            module_name("crc32-generic.ko.zst").as_deref(),
            Some("crc32_generic")
        );
        assert_eq!(module_name("modules.order"), None);
        assert_eq!(module_name(".ko"), None);

        let deps: BTreeMap<&str, Option<Vec<&str>>> = [
            ("rdma_rxe", Some(vec!["ib_uverbs", "ib_core", "udp_tunnel"])),
            ("ib_uverbs", Some(vec!["ib_core"])),
            ("ib_core", Some(vec![])),
            ("udp_tunnel", Some(vec![])),
            ("rdma_ucm", Some(vec!["ib_core", "builtin_thing"])),
            ("builtin_thing", None),
        ]
        .into_iter()
        .collect();
        let lookup = |n: &str| {
            deps.get(n)
                .map(|d| {
                    d.as_ref()
                        .map(|v| v.iter().map(|s| s.to_string()).collect())
                })
                .ok_or_else(|| format!("no {n}"))
        };
        assert_eq!(
            load_order(&["rdma_rxe", "rdma_ucm", "ib_core"], lookup).unwrap(),
            ["ib_core", "ib_uverbs", "udp_tunnel", "rdma_rxe", "rdma_ucm"]
        );
        assert!(load_order(&["missing"], lookup)
            .unwrap_err()
            .contains("no missing"));
        let cyclic = |n: &str| Ok(Some(vec![if n == "a" { "b" } else { "a" }.to_string()]));
        assert!(load_order(&["a"], cyclic)
            .unwrap_err()
            .contains("a -> b -> a"));
    }

    /// A minimal ELF64 with a `.modinfo` section and no program headers.
    fn tiny_elf(modinfo: &[u8]) -> Vec<u8> {
        let names = b"\0.shstrtab\0.modinfo\0";
        let mut f = vec![0u8; 64];
        f[..6].copy_from_slice(b"\x7fELF\x02\x01");
        let names_at = f.len();
        f.extend_from_slice(names);
        let modinfo_at = f.len();
        f.extend_from_slice(modinfo);
        while f.len() % 8 != 0 {
            f.push(0);
        }
        let shoff = f.len();
        // (name offset, data offset, size) for: null, .shstrtab, .modinfo
        for (name, at, size) in [
            (0, 0, 0),
            (1, names_at, names.len()),
            (11, modinfo_at, modinfo.len()),
        ] {
            let mut h = [0u8; 64];
            h[..4].copy_from_slice(&(name as u32).to_le_bytes());
            h[0x18..0x20].copy_from_slice(&(at as u64).to_le_bytes());
            h[0x20..0x28].copy_from_slice(&(size as u64).to_le_bytes());
            f.extend_from_slice(&h);
        }
        f[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        f[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        f[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        f[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        f
    }

    #[test]
    fn modinfo_depends_from_an_elf_section() {
        let elf =
            tiny_elf(b"license=GPL\0depends=ib_uverbs,ib_core,ip6-udp-tunnel\0name=rdma_rxe\0");
        let section = elf_section(&elf, ".modinfo").unwrap();
        assert_eq!(
            modinfo_depends(section),
            ["ib_uverbs", "ib_core", "ip6_udp_tunnel"]
        );
        assert_eq!(elf_section(&elf, ".text"), None);
        assert_eq!(
            modinfo_depends(b"depends=\0name=dummy\0"),
            Vec::<String>::new()
        );
        assert_eq!(elf_section(b"not an elf", ".modinfo"), None);
        // No program headers: static. This test binary itself: dynamic.
        assert_eq!(elf_is_static(&elf), Some(true));
        let me = fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(elf_is_static(&me), Some(false));
    }
}
