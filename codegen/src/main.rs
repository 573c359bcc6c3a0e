//! hotverbs-codegen: turns the system rdma-core headers into `verbs-ffi/src/generated/`.
//!
//! Run through `cargo xtask codegen [--check]`. The generator is pinned to one rdma-core
//! release (see [`PINNED_RDMA_CORE`]); everything it walks is emitted in a deterministic
//! order, and the files it writes open with a preamble naming the header version and the
//! command, so a diff in review always means the headers or the generator changed.
//!
//! Outputs:
//! - `types.rs`: every `ibv_*`, `verbs_*`, `rdma_*` type, enum constant and `#define`
//!   the project can touch, `core`-only (the crate is `#![no_std]`). Enums are plain
//!   constants, never Rust enums: values arrive from C (a provider, a fuzzer) and an
//!   out-of-range Rust enum would be undefined behaviour.
//! - `ibverbs.rs` / `rdmacm.rs`: a function table per library, one `Option<fn>` per
//!   exported function declared in the headers, with the symbol *version* read from the
//!   library itself (`objdump -T`), so the loader binds the default version with `dlvsym`
//!   and never a compat one (`ibv_query_port@IBVERBS_1.0` takes the old struct).
//!
//! Usage: `hotverbs-codegen [--check] [--out DIR] [--against DIR]`
//! - no flag: write into `verbs-ffi/src/generated/`;
//! - `--check`: generate into a temp dir and compare with the committed files
//!   (or with `--against DIR`); exit 1 with "out of date: ..." on any difference.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// The rdma-core major release whose headers the committed bindings come from (Debian
/// bookworm ships 44). Generating from anything else is refused: regenerate on purpose.
const PINNED_RDMA_CORE: &str = "44";

const LIBIBVERBS: &str = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1";
const LIBRDMACM: &str = "/usr/lib/x86_64-linux-gnu/librdmacm.so.1";
const LIBMLX5: &str = "/usr/lib/x86_64-linux-gnu/libmlx5.so.1";

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("hotverbs-codegen: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<ExitCode, String> {
    let mut check = false;
    let mut out: Option<PathBuf> = None;
    let mut against: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--check" => check = true,
            "--out" => out = Some(args.next().ok_or("--out needs a directory")?.into()),
            "--against" => against = Some(args.next().ok_or("--against needs a directory")?.into()),
            "-h" | "--help" => {
                println!("usage: hotverbs-codegen [--check] [--out DIR] [--against DIR]");
                return Ok(ExitCode::SUCCESS);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let root = workspace_root();
    let committed = against.unwrap_or_else(|| root.join("verbs-ffi/src/generated"));
    let files = generate(&root)?;
    if check {
        let mut stale = Vec::new();
        for (name, text) in &files {
            let path = committed.join(name);
            match std::fs::read_to_string(&path) {
                Ok(old) if old == *text => {}
                Ok(_) => stale.push(format!("{} differs", path.display())),
                Err(e) => stale.push(format!("{}: {e}", path.display())),
            }
        }
        if stale.is_empty() {
            println!("codegen: {} generated files up to date", files.len());
            return Ok(ExitCode::SUCCESS);
        }
        for s in &stale {
            eprintln!("  {s}");
        }
        eprintln!("out of date: run `cargo xtask codegen` and commit");
        return Ok(ExitCode::FAILURE);
    }
    let dir = out.unwrap_or(committed);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for (name, text) in &files {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("codegen lives one level below the workspace root")
        .to_path_buf()
}

/// Version of the installed rdma-core development headers, e.g. `44.0-2`.
fn rdma_core_version() -> Result<String, String> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Version}", "libibverbs-dev"])
        .output()
        .map_err(|e| format!("dpkg-query: {e} (codegen runs on Debian with libibverbs-dev)"))?;
    let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || v.is_empty() {
        return Err("libibverbs-dev is not installed: apt-get install libibverbs-dev librdmacm-dev libclang-dev".into());
    }
    let major = v.split(['.', '-']).next().unwrap_or("");
    if major != PINNED_RDMA_CORE {
        return Err(format!(
            "codegen is pinned to rdma-core {PINNED_RDMA_CORE} headers, found {v}: \
             change PINNED_RDMA_CORE on purpose and regenerate"
        ));
    }
    // Drop the Debian revision: the headers are the upstream release's.
    Ok(v.split('-').next().unwrap_or(&v).to_string())
}

fn preamble(version: &str, what: &str) -> String {
    format!(
        "// Generated by `cargo xtask codegen` from rdma-core {version} headers. Do not edit.\n\
         // {what}\n"
    )
}

fn generate(root: &Path) -> Result<BTreeMap<String, String>, String> {
    let version = rdma_core_version()?;
    let header = root.join("codegen/wrapper.h");
    let header = header.to_str().ok_or("non-UTF-8 path")?;
    let mut files = BTreeMap::new();

    // 1. Types and constants.
    let types = base_builder(header)
        .allowlist_type("(_?_?ibv|verbs|rdma|_compat_ibv|ib_uverbs|ibv_flow)_.*")
        .allowlist_var("(IBV|RDMA|IB_UVERBS|VERBS|__VERBS)_.*")
        .generate()
        .map_err(|e| format!("bindgen (types): {e}"))?
        .to_string();
    let mut text = preamble(
        &version,
        "Types, enum constants and #defines of infiniband/verbs.h and rdma/rdma_cma.h.",
    );
    text.push_str(&types);
    files.insert("types.rs".to_string(), text);

    // 1b. The mlx5 direct-verbs types and constants (mlx5dv.h), referring to the verbs
    // types of types.rs rather than repeating them.
    let mlx5_header = root.join("codegen/wrapper_mlx5.h");
    let mlx5_header = mlx5_header.to_str().ok_or("non-UTF-8 path")?;
    let mlx5_types = base_builder(mlx5_header)
        .allowlist_type("(mlx5dv|mlx5|_mlx5dv|_mlx5)_.*|off_t|__off_t|ibv_tmh|ibv_tmh_op")
        .allowlist_var("(MLX5|MLX5DV)_.*")
        .allowlist_recursively(false)
        .raw_line("use super::types::*;")
        .generate()
        .map_err(|e| format!("bindgen (mlx5dv types): {e}"))?
        .to_string();
    // `struct mlx5_wqe_ctrl_seg` is `__packed__` *and* `__aligned__(4)`: bindgen renders
    // that as `packed(4)`, which pads the `__be16` at offset 9 to 10 (20 bytes instead of
    // 16). Plain `packed` gives the C offsets and size (alignment 1 instead of 4, which
    // only matters when embedding it); the equiv layout test checks every offset.
    let bad = "#[repr(C, packed(4))]\npub struct mlx5_wqe_ctrl_seg {";
    if !mlx5_types.contains(bad) {
        return Err(
            "mlx5dv.h: bindgen no longer renders mlx5_wqe_ctrl_seg as packed(4): \
                    re-check its layout and drop this fix-up"
                .into(),
        );
    }
    let mlx5_types = mlx5_types.replace(bad, "#[repr(C, packed)]\npub struct mlx5_wqe_ctrl_seg {");
    let mut text = preamble(
        &version,
        "Types, enum constants and #defines of infiniband/mlx5dv.h (the verbs types come from types.rs).",
    );
    text.push_str(&mlx5_types);
    files.insert("mlx5dv.rs".to_string(), text);

    // 2. Function tables with symbol versions from the libraries themselves.
    for (lib, path, hdr, pattern, table, file, uses) in [
        (
            "libibverbs.so.1",
            LIBIBVERBS,
            header,
            "_?ibv_.*",
            "IbvFns",
            "ibverbs.rs",
            &["types"][..],
        ),
        (
            "librdmacm.so.1",
            LIBRDMACM,
            header,
            "rdma_.*",
            "RdmaCmFns",
            "rdmacm.rs",
            &["types"][..],
        ),
        (
            "libmlx5.so.1",
            LIBMLX5,
            mlx5_header,
            "mlx5dv_.*",
            "Mlx5Fns",
            "mlx5.rs",
            &["types", "mlx5dv"][..],
        ),
    ] {
        let versions = symbol_versions(path)?;
        let decls = base_builder(hdr)
            .allowlist_function(pattern)
            // Debug dumps to a `FILE *`: no use here, and they would drag stdio's types in.
            .blocklist_function("mlx5dv_dump_.*")
            .generate()
            .map_err(|e| format!("bindgen ({lib} functions): {e}"))?
            .to_string();
        let body = function_table(&decls, &versions, lib, table, uses)?;
        let mut text = preamble(
            &version,
            &format!("Runtime-loaded function table of {lib} (default symbol versions)."),
        );
        text.push_str(&body);
        files.insert(file.to_string(), text);
    }
    Ok(files)
}

fn base_builder(header: &str) -> bindgen::Builder {
    bindgen::Builder::default()
        .header(header)
        .use_core()
        .ctypes_prefix("core::ffi")
        .layout_tests(false)
        .generate_comments(false)
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_debug(false)
        .impl_debug(false)
        .sort_semantically(true)
        .merge_extern_blocks(true)
        .formatter(bindgen::Formatter::Prettyplease)
        .raw_line("#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]")
        .raw_line("#![allow(missing_docs, clippy::all, unsafe_op_in_unsafe_fn)]")
        // Our loader binds symbols itself; keep the types free of platform noise.
        .blocklist_type("max_align_t")
}

/// `symbol -> default version` of a shared library's dynamic symbol table. Default
/// versions print bare in `objdump -T` (`IBVERBS_1.1`), hidden/compat ones in
/// parentheses (`(IBVERBS_1.0)`); only the former are kept.
fn symbol_versions(lib: &str) -> Result<BTreeMap<String, String>, String> {
    let out = Command::new("objdump")
        .args(["-T", lib])
        .output()
        .map_err(|e| format!("objdump -T {lib}: {e} (install binutils)"))?;
    if !out.status.success() {
        return Err(format!(
            "objdump -T {lib} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let mut map = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        // ... DF .text  0000000000000045  IBVERBS_1.1 ibv_open_device
        if cols.len() < 3 || !line.contains(" DF ") {
            continue;
        }
        let name = cols[cols.len() - 1];
        let ver = cols[cols.len() - 2];
        if ver.starts_with('(') || !ver.contains('_') {
            continue;
        }
        map.insert(name.to_string(), ver.to_string());
    }
    if map.is_empty() {
        return Err(format!("no versioned symbols found in {lib}"));
    }
    Ok(map)
}

/// Emits `pub struct <table>` with one `Option<unsafe extern "C" fn>` per function that
/// bindgen declared *and* the library exports with a default version, plus the symbol
/// list the loader walks.
fn function_table(
    decls: &str,
    versions: &BTreeMap<String, String>,
    lib: &str,
    table: &str,
    uses: &[&str],
) -> Result<String, String> {
    let file = syn::parse_file(decls).map_err(|e| format!("parsing bindgen output: {e}"))?;
    let mut fns = BTreeMap::new();
    for item in &file.items {
        if let syn::Item::ForeignMod(m) = item {
            for fi in &m.items {
                if let syn::ForeignItem::Fn(f) = fi {
                    let name = f.sig.ident.to_string();
                    if let Some(ver) = versions.get(&name) {
                        fns.insert(name, (f.sig.clone(), ver.clone()));
                    }
                }
            }
        }
    }
    if fns.is_empty() {
        return Err(format!(
            "no exported functions of {lib} matched the headers"
        ));
    }
    let mut fields = Vec::new();
    let mut nones = Vec::new();
    let mut loads = Vec::new();
    let mut syms = Vec::new();
    for (name, (sig, ver)) in &fns {
        let ident = &sig.ident;
        let inputs = &sig.inputs;
        let output = &sig.output;
        if sig.variadic.is_some() {
            // No bound library exports one the hot path needs; the table cannot express it.
            eprintln!("codegen: skipping variadic {name} of {lib}");
            continue;
        }
        let doc = format!(" `{name}@{ver}`");
        fields.push(quote::quote! {
            #[doc = #doc]
            pub #ident: Option<unsafe extern "C" fn(#inputs) #output>
        });
        nones.push(quote::quote! { #ident: None });
        let cname = proc_macro2::Literal::c_string(&std::ffi::CString::new(name.as_str()).unwrap());
        let cver = proc_macro2::Literal::c_string(&std::ffi::CString::new(ver.as_str()).unwrap());
        syms.push(quote::quote! { (#cname, #cver) });
        loads.push(quote::quote! {
            // SAFETY: `sym` returns the address of `#name@#ver` or null; the symbol has the
            // C signature the header declares, which is this field's type, and
            // `Option<extern fn>` has the layout of a nullable function pointer.
            #ident: unsafe { core::mem::transmute::<*mut core::ffi::c_void, Option<unsafe extern "C" fn(#inputs) #output>>(sym(#cname, #cver)) }
        });
    }
    let table_ident = syn::Ident::new(table, proc_macro2::Span::call_site());
    let doc = format!(
        " Function table of `{lib}`: one entry per exported function the headers declare,\n \
         bound by `dlvsym` to the version named in its doc line. `None` when the running\n \
         library lacks the symbol (older rdma-core) or the table was filled by a software\n \
         device that does not implement the verb."
    );
    let n = syms.len();
    let use_mods = uses
        .iter()
        .map(|m| syn::Ident::new(m, proc_macro2::Span::call_site()));
    let tokens = quote::quote! {
        #(use super::#use_mods::*;)*

        #[doc = #doc]
        #[derive(Clone, Copy)]
        pub struct #table_ident {
            #(#fields,)*
        }

        impl #table_ident {
            /// A table with every entry `None`, to be filled field by field.
            pub const EMPTY: Self = Self { #(#nones,)* };

            /// `(symbol, version)` of every entry, in field order.
            pub const SYMBOLS: [(&'static core::ffi::CStr, &'static core::ffi::CStr); #n] = [#(#syms,)*];

            /// Fills the table by resolving each symbol through `sym(name, version)`
            /// (`dlvsym` on the opened library).
            ///
            /// # Safety
            /// `sym` must return null or the address of the named symbol of the library
            /// these declarations describe.
            pub unsafe fn load_with(mut sym: impl FnMut(&core::ffi::CStr, &core::ffi::CStr) -> *mut core::ffi::c_void) -> Self {
                Self { #(#loads,)* }
            }
        }
    };
    let file: syn::File = syn::parse2(tokens)
        .map_err(|e| format!("internal: generated table does not parse: {e}"))?;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "#![allow(non_camel_case_types, non_snake_case, clippy::all, clippy::missing_safety_doc)]"
    );
    s.push_str(&prettyplease::unparse(&file));
    Ok(s)
}
