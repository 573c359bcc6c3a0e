//! The initramfs: the guest's root as a plan of entries, its manifest (rebuild only when it
//! changes), and the `cpio | gzip` image.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Instant, UNIX_EPOCH};

use super::guest::{INIT, LIB_SH};
use super::kernel::Kernel;
use super::modules::kernel_modules;
use super::prerequisites::{HostFiles, RXE_DRIVER};
use super::{capture, rel, GUEST_IP};

enum Content {
    Dir,
    Link(String),
    File(PathBuf),
    Bytes(Vec<u8>),
}

struct Entry {
    content: Content,
    mode: u32,
    /// What identifies the content in the manifest (source, size, mtime; or a hash).
    key: String,
}

/// Everything that goes into the initramfs, by path inside it.
#[derive(Default)]
pub(super) struct Plan {
    entries: BTreeMap<String, Entry>,
}

impl Plan {
    fn add(&mut self, path: &str, content: Content, mode: u32, key: String) {
        self.entries
            .insert(path.to_string(), Entry { content, mode, key });
    }

    fn dir(&mut self, path: &str) {
        self.add(path, Content::Dir, 0o755, "dir".into());
    }

    fn link(&mut self, path: &str, target: &str) {
        self.add(
            path,
            Content::Link(target.into()),
            0o777,
            format!("-> {target}"),
        );
    }

    fn file(&mut self, path: &str, source: &Path, mode: u32) -> Result<(), String> {
        let key = file_key(source)?;
        self.add(path, Content::File(source.into()), mode, key);
        Ok(())
    }

    fn text(&mut self, path: &str, text: &str, mode: u32) {
        let key = format!("fnv1a64 {:016x}", fnv1a64(text.as_bytes()));
        self.add(path, Content::Bytes(text.as_bytes().to_vec()), mode, key);
    }

    pub(super) fn has(&self, path: &str) -> bool {
        self.entries.contains_key(path)
    }

    /// Adds a host library at its canonical path (merged /usr: `/lib/x/libc.so.6` lands in
    /// `usr/lib/x/libc.so.6`, and the guest's `/lib` links there), keeping its soname.
    fn library(&mut self, host: &Path) -> Result<(), String> {
        let path = guest_path(host)?;
        if !self.has(&path) {
            self.file(&path, host, 0o755)?;
        }
        Ok(())
    }

    /// Adds the libraries `ldd` lists for `binary`.
    fn libraries_of(&mut self, binary: &Path) -> Result<(), String> {
        for lib in ldd(binary)? {
            self.library(&lib)?;
        }
        Ok(())
    }

    /// The manifest: one line per entry; equal manifests mean equal initramfs contents.
    fn manifest(&self) -> String {
        let mut m = String::from("# cargo xtask rxe initramfs manifest v1\n");
        for (path, e) in &self.entries {
            let _ = writeln!(m, "{:o} {path} {}", e.mode, e.key);
        }
        m
    }

    /// Writes the tree under `root` (which must not exist).
    fn materialize(&self, root: &Path) -> Result<(), String> {
        let err = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
        for (path, e) in &self.entries {
            let dst = root.join(path);
            if let Some(parent) = dst.parent() {
                fs::create_dir_all(parent).map_err(|x| err(parent, x))?;
            }
            match &e.content {
                Content::Dir => fs::create_dir_all(&dst).map_err(|x| err(&dst, x))?,
                Content::Link(target) => symlink(target, &dst).map_err(|x| err(&dst, x))?,
                Content::File(src) => {
                    fs::copy(src, &dst).map_err(|x| err(src, x))?;
                }
                Content::Bytes(data) => fs::write(&dst, data).map_err(|x| err(&dst, x))?,
            }
            if !matches!(e.content, Content::Link(_)) {
                fs::set_permissions(&dst, fs::Permissions::from_mode(e.mode))
                    .map_err(|x| err(&dst, x))?;
            }
        }
        Ok(())
    }
}

fn file_key(path: &Path) -> Result<String, String> {
    let m = fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mtime = m
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    Ok(format!("{} {} {mtime}", path.display(), m.len()))
}

/// FNV-1a, 64 bit: a stable content hash for the manifest (std's hasher may change).
fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Where a host library goes in the guest: its canonical folder, its own (soname) name.
pub(super) fn guest_path(host: &Path) -> Result<String, String> {
    let (Some(dir), Some(name)) = (host.parent(), host.file_name()) else {
        return Err(format!("not a library path: {}", host.display()));
    };
    let dir = fs::canonicalize(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir
        .join(name)
        .to_string_lossy()
        .trim_start_matches('/')
        .to_string())
}

/// The libraries `ldd` lists for `binary` (none for a static one).
pub(super) fn ldd(binary: &Path) -> Result<Vec<PathBuf>, String> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|e| format!("ldd: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        if text.contains("not a dynamic executable") || err.contains("not a dynamic executable") {
            return Ok(Vec::new());
        }
        return Err(format!("ldd {} failed: {}", binary.display(), err.trim()));
    }
    parse_ldd(&text).map_err(|e| format!("ldd {}: {e}", binary.display()))
}

/// Library paths in `ldd` output; an unresolved library is an error.
fn parse_ldd(text: &str) -> Result<Vec<PathBuf>, String> {
    let mut libs = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let path = match line.split_once("=>") {
            Some((name, rest)) => {
                let rest = rest.trim();
                if rest.starts_with("not found") {
                    return Err(format!("{} not found", name.trim()));
                }
                rest.split_whitespace().next().unwrap_or("")
            }
            None => line.split_whitespace().next().unwrap_or(""),
        };
        // linux-vdso.so.1 and friends have no file.
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

fn busybox_applets(busybox: &Path) -> Result<Vec<String>, String> {
    let text = capture(Command::new(busybox).arg("--list"))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|a| !a.is_empty() && !a.contains('/'))
        .map(str::to_string)
        .collect())
}

pub(super) fn initramfs_plan(kernel: &Kernel, host: &HostFiles) -> Result<Plan, String> {
    let mut plan = Plan::default();
    for dir in [
        "dev", "proc", "sys", "tmp", "run", "root", "host", "usr/sbin",
    ] {
        plan.dir(dir);
    }
    for (link, target) in [
        ("bin", "usr/bin"),
        ("sbin", "usr/sbin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        plan.link(link, target);
    }
    plan.file("usr/bin/busybox", &host.busybox, 0o755)?;
    for applet in busybox_applets(&host.busybox)? {
        // (the list names busybox itself)
        let path = format!("usr/bin/{applet}");
        if !plan.has(&path) {
            plan.link(&path, "busybox");
        }
    }
    // Real programs replace busybox applets of the same name.
    for (name, path) in &host.programs {
        plan.file(&format!("usr/bin/{name}"), path, 0o755)?;
        plan.libraries_of(path)?;
    }
    for lib in host.libs.iter().chain([&host.provider]) {
        plan.library(lib)?;
        plan.libraries_of(lib)?;
    }
    plan.file("etc/libibverbs.d/rxe.driver", Path::new(RXE_DRIVER), 0o644)?;
    plan.text("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n", 0o644);
    plan.text("etc/group", "root:x:0:\n", 0o644);
    plan.text(
        "etc/hosts",
        &format!("127.0.0.1 localhost\n{GUEST_IP} vm\n"),
        0o644,
    );
    plan.text("etc/nsswitch.conf", "hosts: files\n", 0o644);

    let mut order = String::new();
    for m in kernel_modules(&kernel.modules)? {
        let _ = writeln!(order, "{} {}", m.name, m.params);
        let key = file_key(&m.source)?;
        plan.add(
            &format!("usr/lib/rxe/modules/{}.ko", m.name),
            Content::Bytes(m.data),
            0o644,
            key,
        );
    }
    plan.text("usr/lib/rxe/modules.order", &order, 0o644);
    plan.text("usr/lib/rxe/lib.sh", LIB_SH, 0o644);
    plan.text("init", INIT, 0o755);
    Ok(plan)
}

/// `target/rxe/initramfs.cpio.gz`, rebuilt when the plan's manifest changed.
pub(super) fn build_initramfs(rxe_dir: &Path, plan: &Plan) -> Result<PathBuf, String> {
    let image = rxe_dir.join("initramfs.cpio.gz");
    let manifest_path = rxe_dir.join("initramfs.manifest");
    let manifest = plan.manifest();
    if image.exists() && fs::read_to_string(&manifest_path).ok().as_deref() == Some(&*manifest) {
        println!("rxe: initramfs up to date ({} entries)", plan.entries.len());
        return Ok(image);
    }
    let started = Instant::now();
    let root = rxe_dir.join("initramfs");
    let _ = fs::remove_file(&manifest_path);
    if root.exists() {
        fs::remove_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
    }
    plan.materialize(&root)?;
    let tmp = rxe_dir.join("initramfs.cpio.gz.tmp");
    pack(&root, &tmp)?;
    fs::rename(&tmp, &image).map_err(|e| format!("{}: {e}", image.display()))?;
    fs::write(&manifest_path, manifest).map_err(|e| format!("{}: {e}", manifest_path.display()))?;
    let size = fs::metadata(&image).map(|m| m.len()).unwrap_or(0);
    println!(
        "rxe: built {} ({} entries, {:.1} MB) in {:.1} s",
        rel(&image).display(),
        plan.entries.len(),
        size as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
    Ok(image)
}

/// `cpio -o -H newc | gzip` of everything below `root`, owned by root.
fn pack(root: &Path, out: &Path) -> Result<(), String> {
    let mut names = Vec::new();
    walk(root, Path::new(""), &mut names)?;
    let file = fs::File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut gzip = Command::new("gzip")
        .args(["-1", "-n"])
        .stdin(Stdio::piped())
        .stdout(file)
        .spawn()
        .map_err(|e| format!("gzip: {e}"))?;
    let gzip_in = gzip.stdin.take().expect("piped");
    let mut cpio = Command::new("cpio")
        .args(["-o", "-H", "newc", "--quiet", "-R", "0:0"])
        .current_dir(root)
        .stdin(Stdio::piped())
        .stdout(gzip_in)
        .spawn()
        .map_err(|e| format!("cpio: {e}"))?;
    let mut list = String::new();
    for name in &names {
        list.push_str(&name.to_string_lossy());
        list.push('\n');
    }
    // cpio streams into gzip while it reads the list, so writing it all first cannot block
    // for good.
    let written = cpio.stdin.take().expect("piped").write_all(list.as_bytes());
    let cpio_status = cpio.wait().map_err(|e| format!("cpio: {e}"))?;
    let gzip_status = gzip.wait().map_err(|e| format!("gzip: {e}"))?;
    written.map_err(|e| format!("feeding cpio: {e}"))?;
    if !cpio_status.success() || !gzip_status.success() {
        return Err(format!("cpio | gzip failed ({cpio_status}, {gzip_status})"));
    }
    Ok(())
}

/// Relative paths of everything below `root`, parents before children, sorted.
fn walk(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let dir = root.join(rel);
    let mut entries: Vec<_> = fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = rel.join(entry.file_name());
        out.push(path.clone());
        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            walk(root, &path, out)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rxe::guest::expand;

    #[test]
    fn ldd_output_gives_library_paths() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                   \tlibibverbs.so.1 => /lib/x86_64-linux-gnu/libibverbs.so.1 (0x00007f1)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f3)\n";
        assert_eq!(
            parse_ldd(out).unwrap(),
            [
                "/lib/x86_64-linux-gnu/libibverbs.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
        assert!(parse_ldd("\tlibfoo.so.1 => not found\n")
            .unwrap_err()
            .contains("libfoo.so.1"));
    }

    #[test]
    fn templates_expand_and_manifests_track_content() {
        assert_eq!(
            expand("x -d {dev} -x {gid} {ip}"),
            ["x", "-d", "rxe0", "-x", "1", "10.77.0.1"]
        );
        let mut a = Plan::default();
        a.text("init", "echo one\n", 0o755);
        let mut b = Plan::default();
        b.text("init", "echo two\n", 0o755);
        assert_ne!(a.manifest(), b.manifest());
        b.text("init", "echo one\n", 0o755);
        assert_eq!(a.manifest(), b.manifest());
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
