//! `cargo xtask package`: what `cargo publish` would upload, checked before anyone publishes.
//!
//! For the publishable crates ([`CRATES`], in dependency order):
//! 1. The licence copies in each crate directory equal the root's (cargo packages only
//!    files inside a crate's directory, so every crate ships its own copy of both).
//! 2. `cargo package --list`: the list must hold `Cargo.toml`, `README.md`, `LICENSE-MIT`,
//!    `LICENSE-APACHE` and `src/lib.rs` (`src/main.rs` for the binary), and nothing but
//!    sources, docs, licences and cargo's own files: no `tests/`, no `benches/`, no data
//!    (each crate's `include` in its Cargo.toml decides; this check keeps it honest).
//! 3. One `cargo package` of all of them: cargo packs them in dependency order and
//!    *verifies* each `.crate` by building it against the `.crate`s packed before it (a
//!    local registry overlay), so none of them needs to be on crates.io yet and
//!    `--no-verify` is never needed. (`--no-verify` would not help anyway: cargo puts a
//!    `Cargo.lock` in every package, and resolving it for one crate packed alone looks its
//!    workspace dependencies up on crates.io, where they are not yet.) cargo's warnings
//!    fail the step, except the expected "ignoring test ... not included" ones.
//! 4. The files inside each `.crate` (read with `tar`): at most [`MAX_FILE_BYTES`] each,
//!    except the ones named in [`LARGE_FILES`] with their own caps, so a large generated
//!    file never ships by accident.
//! 5. The crate READMEs' ` ```rust ` examples appear verbatim in the crate docs (`src/lib.rs`),
//!    where they run as doctests: the registry page shows code that compiles.
//! 6. The docs as docs.rs builds them: `cargo doc --no-deps --all-features -p <crate>` with
//!    `RUSTDOCFLAGS="-D warnings --cfg docsrs"` (see [`docs`] on `--cfg docsrs`).
//!
//! Then a table: crate, files, packaged size, `.crate` size.

use std::path::PathBuf;
use std::process::Command;

use crate::util::{cargo, root, run, show};

/// A publishable crate: package name, directory, and whether it is a library.
struct Crate {
    name: &'static str,
    dir: &'static str,
    lib: bool,
}

/// The publishable crates, in the order they must be published (each after its
/// dependencies). codegen, benches, xtask, verbs-ffi/equiv and fuzz are `publish = false`.
const CRATES: &[Crate] = &[
    Crate {
        name: "hotverbs-ffi",
        dir: "verbs-ffi",
        lib: true,
    },
    Crate {
        name: "hotverbs-datapath",
        dir: "datapath",
        lib: true,
    },
    Crate {
        name: "hotverbs-softnic",
        dir: "softnic",
        lib: true,
    },
    Crate {
        name: "hotverbs",
        dir: "verbs",
        lib: true,
    },
    Crate {
        name: "hotverbs-perf",
        dir: "perf",
        lib: false,
    },
];

/// Largest file a package may hold unless [`LARGE_FILES`] names it. The largest
/// hand-written source today is about 66 KB; a file past this is generated or data.
const MAX_FILE_BYTES: u64 = 100 * 1024;

/// Files allowed past [`MAX_FILE_BYTES`], each with its own cap and the reason it ships.
const LARGE_FILES: &[(&str, &str, u64, &str)] = &[(
    "hotverbs-ffi",
    "src/generated/types.rs",
    256 * 1024,
    // 171 KB at rdma-core 44.0: bindgen's types, enum constants and #defines of verbs.h
    // and rdma_cma.h, without layout tests. Every build needs it (it *is* the ABI); the
    // cap leaves room for a header upgrade and still stops a runaway generator.
    "bindgen output for verbs.h and rdma_cma.h",
)];

/// Files cargo writes into every package besides the crate's own.
const CARGO_FILES: &[&str] = &[
    "Cargo.toml",
    "Cargo.toml.orig",
    "Cargo.lock",
    ".cargo_vcs_info.json",
];

/// Files every package must hold (besides its `src/lib.rs` or `src/main.rs`).
const REQUIRED: &[&str] = &["Cargo.toml", "README.md", "LICENSE-MIT", "LICENSE-APACHE"];

/// `cargo xtask package`.
pub fn run_package(args: &[String]) -> Result<(), String> {
    if let Some(a) = args.first() {
        return Err(format!(
            "unknown option {a:?} (`cargo xtask package` takes none)"
        ));
    }
    licences()?;
    for c in CRATES {
        check_list(c)?;
        readme_examples(c)?;
    }
    let crates = pack_all()?;
    docs()?;
    println!(
        "{:<20} {:>6} {:>12} {:>10}",
        "crate", "files", "packaged", ".crate"
    );
    for (c, files, bytes, crate_bytes) in &crates {
        println!(
            "{:<20} {files:>6} {:>12} {:>10}",
            c.name,
            kib(*bytes),
            kib(*crate_bytes)
        );
    }
    Ok(())
}

fn kib(bytes: u64) -> String {
    format!("{:.1} KiB", bytes as f64 / 1024.0)
}

/// Step 1: each crate's licence files are copies of the root's.
fn licences() -> Result<(), String> {
    for file in ["LICENSE-MIT", "LICENSE-APACHE"] {
        let want = read(&root().join(file))?;
        for c in CRATES {
            let got = read(&root().join(c.dir).join(file))?;
            if got != want {
                return Err(format!(
                    "{}/{file} differs from the root's {file}: `cp {file} {}/`",
                    c.dir, c.dir
                ));
            }
        }
    }
    Ok(())
}

fn read(path: &std::path::Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Step 2: `cargo package --list` holds what a user needs and nothing that stays home.
fn check_list(c: &Crate) -> Result<(), String> {
    let mut cmd = cargo();
    cmd.args([
        "package",
        "--list",
        "--allow-dirty",
        "--locked",
        "-p",
        c.name,
    ])
    .current_dir(root());
    eprintln!("$ {}", show(&cmd));
    let out = cmd.output().map_err(|e| format!("{}: {e}", show(&cmd)))?;
    if !out.status.success() {
        return Err(format!(
            "`{}` failed:\n{}",
            show(&cmd),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let list: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    let entry = if c.lib { "src/lib.rs" } else { "src/main.rs" };
    for need in REQUIRED.iter().chain([&entry]) {
        if !list.iter().any(|f| f == need) {
            return Err(format!(
                "{}: the package lacks {need} (check `include` in {}/Cargo.toml)",
                c.name, c.dir
            ));
        }
    }
    for f in &list {
        if let Some(why) = unwanted(f) {
            return Err(format!(
                "{}: the package would ship {f} ({why}); leave it out with `include` in \
                 {}/Cargo.toml",
                c.name, c.dir
            ));
        }
    }
    Ok(())
}

/// Why `path` (relative to the crate) must not be published, or `None` if it may.
fn unwanted(path: &str) -> Option<&'static str> {
    if CARGO_FILES.contains(&path) || matches!(path, "LICENSE-MIT" | "LICENSE-APACHE") {
        return None;
    }
    let top = path.split('/').next().unwrap_or("");
    if matches!(top, "tests" | "benches" | "fuzz" | "target") {
        return Some("tests, benches and their data stay in the repository");
    }
    if !matches!(top, "src" | "examples") && path != "README.md" {
        return Some("only src/, examples/, the README and the licences are published");
    }
    if !(path.ends_with(".rs") || path.ends_with(".md")) {
        return Some("not Rust source or Markdown: data, fixtures or build output");
    }
    None
}

/// Step 5: every ` ```rust ` block of the crate's README is part of its `//!` docs, where
/// it runs as a doctest (hidden `# ` lines of the doctest may be left out of the README).
fn readme_examples(c: &Crate) -> Result<(), String> {
    let readme = read(&root().join(c.dir).join("README.md"))?;
    let entry = if c.lib { "src/lib.rs" } else { "src/main.rs" };
    let docs: String = read(&root().join(c.dir).join(entry))?
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .filter(|l| !(l.trim_start() == "#" || l.trim_start().starts_with("# ")))
        .flat_map(|l| [l, "\n"])
        .collect();
    let mut block: Option<String> = None;
    for line in readme.lines() {
        match (&mut block, line.trim_end()) {
            (None, "```rust") => block = Some(String::new()),
            (Some(b), "```") => {
                if !docs.contains(b.as_str()) {
                    return Err(format!(
                        "{}/README.md: a ```rust example is not in {}/{entry}'s docs any more \
                         (where it would be doctested): copy the example from there",
                        c.dir, c.dir
                    ));
                }
                block = None;
            }
            (Some(b), _) => {
                b.push_str(line);
                b.push('\n');
            }
            (None, _) => {}
        }
    }
    Ok(())
}

/// Step 3 and 4: pack (and verify) every crate in one cargo run, then measure each
/// `.crate`. Returns (crate, files, bytes unpacked, bytes of the `.crate`).
fn pack_all() -> Result<Vec<(&'static Crate, usize, u64, u64)>, String> {
    clear_stale_overlays()?;
    let mut cmd = cargo();
    cmd.args(["package", "--allow-dirty", "--locked"]);
    for c in CRATES {
        cmd.args(["-p", c.name]);
    }
    // The verification builds get a target dir of their own, emptied first: cargo keys a
    // registry crate's build on its name and version, not its contents, so a kept target dir
    // would link the previous run's `hotverbs-ffi 0.1.0` (same version, older code) into
    // this run's `hotverbs` (seen locally; CI's clone has a fresh target dir).
    let verify_dir = target_dir().join("package-verify");
    if verify_dir.exists() {
        std::fs::remove_dir_all(&verify_dir)
            .map_err(|e| format!("removing {}: {e}", verify_dir.display()))?;
    }
    cmd.env("CARGO_TARGET_DIR", &verify_dir);
    cmd.current_dir(root());
    eprintln!("$ {}", show(&cmd));
    let out = cmd.output().map_err(|e| format!("{}: {e}", show(&cmd)))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let mut left_out = 0;
    let mut warnings = Vec::new();
    for line in stderr.lines() {
        // Excluding tests/ from a package is the point; cargo names each one it drops.
        if line.starts_with("warning: ignoring test ")
            && line.ends_with("is not included in the published package")
        {
            left_out += 1;
            continue;
        }
        eprintln!("{line}");
        if line.starts_with("warning") {
            warnings.push(line.to_string());
        }
    }
    if !out.status.success() {
        let hint = if stderr.contains("no matching package named") {
            "\nhint: a publishable crate (dev-)depends on a workspace crate that is packed \
             after it. A dev-dependency that closes a cycle (e.g. datapath's tests on \
             `hotverbs`, which depends on datapath) must be path-only, without `version` and \
             not `workspace = true`: cargo then drops it from the published manifest."
        } else {
            ""
        };
        return Err(format!("`{}` failed ({}){hint}", show(&cmd), out.status));
    }
    if !warnings.is_empty() {
        return Err(format!(
            "cargo package warned (fix the manifest):\n{}",
            warnings.join("\n")
        ));
    }
    eprintln!("({left_out} integration test targets left out of the packages, as intended)");
    let target = verify_dir;
    let mut sizes = Vec::new();
    for c in CRATES {
        let file = target
            .join("package")
            .join(format!("{}-{}.crate", c.name, version(c)?));
        let crate_bytes = std::fs::metadata(&file)
            .map_err(|e| format!("{}: {e}", file.display()))?
            .len();
        let (files, bytes) = check_sizes(c, &file)?;
        sizes.push((c, files, bytes, crate_bytes));
    }
    Ok(sizes)
}

/// Removes earlier extractions of our own crates from cargo's overlay registries.
///
/// Verifying several packages in one run, cargo serves the freshly packed crates from a
/// temporary local registry and unpacks them under `$CARGO_HOME/registry/src/-<hash>/`, the
/// hash being that of the workspace path. It never unpacks a `name-version` that is already
/// there, so a CI machine that keeps its cargo home and checks out at the same path verified
/// `hotverbs` against the *previous* run's `hotverbs-datapath-0.1.0` (the version does not
/// change between commits) and failed on an import added since. Only the overlay directories
/// (named `-<hash>`, never a real registry's `index.crates.io-...`) and only our crate names
/// are touched.
fn clear_stale_overlays() -> Result<(), String> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let Some(src) = home.map(|h| h.join("registry").join("src")) else {
        return Ok(());
    };
    let Ok(dirs) = std::fs::read_dir(&src) else {
        return Ok(());
    };
    for dir in dirs.flatten() {
        if !dir.file_name().to_string_lossy().starts_with('-') {
            continue;
        }
        for c in CRATES {
            let stale = dir.path().join(format!("{}-{}", c.name, version(c)?));
            if stale.exists() {
                std::fs::remove_dir_all(&stale)
                    .map_err(|e| format!("removing stale {}: {e}", stale.display()))?;
                eprintln!("(removed a stale unpacked {})", stale.display());
            }
        }
    }
    Ok(())
}

/// The workspace's target dir (`CARGO_TARGET_DIR` or `target/`).
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

/// The crate's version, from `cargo pkgid` (`path+file:///...#name@0.1.0`).
fn version(c: &Crate) -> Result<String, String> {
    let out = cargo()
        .args(["pkgid", "-p", c.name])
        .current_dir(root())
        .output()
        .map_err(|e| format!("cargo pkgid: {e}"))?;
    let id = String::from_utf8_lossy(&out.stdout);
    match id.trim().rsplit_once(['@', '#']) {
        Some((_, v)) if out.status.success() && v.starts_with(|c: char| c.is_ascii_digit()) => {
            Ok(v.to_string())
        }
        _ => Err(format!("cargo pkgid -p {}: unexpected {id:?}", c.name)),
    }
}

/// Step 4: every file in the `.crate` within its size cap. Returns (files, total bytes).
fn check_sizes(c: &Crate, file: &std::path::Path) -> Result<(usize, u64), String> {
    let out = Command::new("tar")
        .arg("-tzvf")
        .arg(file)
        .output()
        .map_err(|e| format!("tar -tzvf {}: {e}", file.display()))?;
    if !out.status.success() {
        return Err(format!("tar -tzvf {} failed", file.display()));
    }
    let (mut files, mut total) = (0, 0);
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // `-rw-r--r-- 0/0   1080 2006-07-24 01:21 hotverbs-ffi-0.1.0/LICENSE-MIT`
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(size), Some(path)) = (fields.get(2), fields.get(5)) else {
            return Err(format!("tar listing: unexpected line {line:?}"));
        };
        let size: u64 = size
            .parse()
            .map_err(|_| format!("tar listing: no size in {line:?}"))?;
        let path = path.split_once('/').map_or(*path, |(_, p)| p);
        let cap = LARGE_FILES
            .iter()
            .find(|(krate, p, _, _)| *krate == c.name && *p == path)
            .map_or(MAX_FILE_BYTES, |&(_, _, cap, _)| cap);
        if size > cap {
            return Err(format!(
                "{}: {path} is {} in the package, over the {} cap; if it must ship, name it in \
                 LARGE_FILES (xtask/src/package.rs) with its own cap and the reason",
                c.name,
                kib(size),
                kib(cap)
            ));
        }
        files += 1;
        total += size;
    }
    Ok((files, total))
}

/// Step 6: each library's docs as docs.rs builds them (`[package.metadata.docs.rs]`
/// `all-features = true`), warnings denied.
///
/// `--cfg docsrs`: docs.rs builds with nightly and passes it; we build with stable. Our
/// crates do not use `#![cfg_attr(docsrs, feature(doc_cfg))]` (nightly-only; the few
/// features, `rdmacm` and `std`, are documented in prose on the items they add), so on
/// our crates the flag changes nothing and we pass it to build the same cfg set docs.rs
/// does. It is in RUSTDOCFLAGS only, and with `--no-deps` rustdoc runs on our crates only,
/// so dependencies that do use `doc_cfg` under `docsrs` are compiled without it. Should a
/// crate of ours start using a nightly doc feature under `docsrs`, this step fails on
/// stable: that choice (and how CI then builds docs) has to be made deliberately.
fn docs() -> Result<(), String> {
    for c in CRATES.iter().filter(|c| c.lib) {
        run(cargo()
            .args([
                "doc",
                "--no-deps",
                "--all-features",
                "--locked",
                "-p",
                c.name,
            ])
            .env("RUSTDOCFLAGS", "-D warnings --cfg docsrs"))?;
    }
    Ok(())
}
