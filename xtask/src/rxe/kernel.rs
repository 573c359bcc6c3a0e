//! The kernel: Debian's current one, downloaded and unpacked (never installed).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{capture, rel};
use crate::util;

pub(super) struct Kernel {
    pub(super) package: String,
    pub(super) vmlinuz: PathBuf,
    /// `lib/modules/<version>` of the unpacked package.
    pub(super) modules: PathBuf,
}

impl Kernel {
    /// The kernel's tick rate (`CONFIG_HZ` of the package's `boot/config-*`), or "?". The
    /// perf report quotes it: rxe work left to `ksoftirqd` waits up to one tick.
    pub(super) fn hz(&self) -> String {
        let name = self
            .vmlinuz
            .file_name()
            .unwrap_or_default()
            .to_string_lossy();
        let config = self
            .vmlinuz
            .with_file_name(name.replacen("vmlinuz-", "config-", 1));
        fs::read_to_string(config)
            .ok()
            .and_then(|text| {
                text.lines()
                    .find_map(|l| l.strip_prefix("CONFIG_HZ=").map(str::to_string))
            })
            .unwrap_or_else(|| "?".into())
    }
}

pub(super) fn kernel(rxe_dir: &Path) -> Result<Kernel, String> {
    let kernels = rxe_dir.join("kernel");
    let package = match current_kernel_package().or_else(|e| {
        // A fresh machine whose packages were all present may never have fetched apt's
        // lists (the ci packages step only updates when it installs something).
        if cached_kernels(&kernels).is_empty() && is_root() {
            println!("rxe: {e}\nrxe: running apt-get update");
            let _ = Command::new("apt-get")
                .args(["update", "-q"])
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status();
            current_kernel_package()
        } else {
            Err(e)
        }
    }) {
        Ok(p) => p,
        Err(e) => {
            // Offline or without apt lists: a cached kernel still does the job.
            let cached = cached_kernels(&kernels);
            match cached.as_slice() {
                [one] => {
                    println!("rxe: {e}\nrxe: using the cached {one}");
                    one.clone()
                }
                _ => return Err(e),
            }
        }
    };
    let dir = kernels.join(&package);
    let stamp = dir.join(".unpacked");
    if stamp.exists() {
        println!("rxe: kernel {package} (cached)");
    } else {
        download_kernel(rxe_dir, &kernels, &package)?;
    }
    let boot = dir.join("boot");
    let vmlinuz = fs::read_dir(&boot)
        .map_err(|e| format!("{}: {e}", boot.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .starts_with("vmlinuz-")
        })
        .ok_or_else(|| format!("no vmlinuz-* in {}", boot.display()))?;
    let version =
        vmlinuz.file_name().unwrap_or_default().to_string_lossy()["vmlinuz-".len()..].to_string();
    let modules = ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|m| dir.join(m).join(&version))
        .find(|p| p.is_dir())
        .ok_or_else(|| format!("no lib/modules/{version} in {}", dir.display()))?;
    Ok(Kernel {
        package,
        vmlinuz,
        modules,
    })
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// The kernel image package `linux-image-amd64` currently depends on.
fn current_kernel_package() -> Result<String, String> {
    let mut cmd = Command::new("apt-cache");
    cmd.args(["depends", "linux-image-amd64"]);
    let hint = "run `apt-get update` (as root) so apt knows Debian's current kernel";
    let text = capture(&mut cmd).map_err(|e| format!("{e}\n{hint}"))?;
    parse_apt_depends(&text).ok_or_else(|| {
        format!("`apt-cache depends linux-image-amd64` names no linux-image-*; {hint}")
    })
}

/// The first `linux-image-*` dependency in `apt-cache depends` output.
fn parse_apt_depends(text: &str) -> Option<String> {
    text.lines()
        .filter_map(|l| l.trim().trim_start_matches('|').strip_prefix("Depends:"))
        .map(|d| d.trim().trim_start_matches('<').trim_end_matches('>'))
        .find(|d| {
            d.starts_with("linux-image-")
                && d.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-+.".contains(&b))
        })
        .map(str::to_string)
}

fn cached_kernels(kernels: &Path) -> Vec<String> {
    let mut found: Vec<String> = fs::read_dir(kernels)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join(".unpacked").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    found
}

fn download_kernel(rxe_dir: &Path, kernels: &Path, package: &str) -> Result<(), String> {
    let debs = rxe_dir.join("deb");
    fs::create_dir_all(&debs).map_err(|e| format!("{}: {e}", debs.display()))?;
    let find_deb = || {
        fs::read_dir(&debs).ok().and_then(|rd| {
            rd.flatten().map(|e| e.path()).find(|p| {
                let n = p.file_name().unwrap_or_default().to_string_lossy();
                n.starts_with(&format!("{package}_")) && n.ends_with(".deb")
            })
        })
    };
    let deb = match find_deb() {
        Some(deb) => deb,
        None => {
            println!("rxe: downloading {package} (about 70 MB, once)");
            let mut cmd = Command::new("apt-get");
            // As root apt would sandbox the download as _apt, who cannot write here.
            cmd.args(["-o", "APT::Sandbox::User=root", "download", package])
                .current_dir(&debs);
            eprintln!("$ (cd {} && {})", debs.display(), util::show(&cmd));
            let status = cmd.status().map_err(|e| format!("apt-get: {e}"))?;
            if !status.success() {
                return Err(format!(
                    "`apt-get download {package}` failed ({status}); `apt-get update` may help"
                ));
            }
            find_deb()
                .ok_or_else(|| format!("apt-get left no {package}_*.deb in {}", debs.display()))?
        }
    };
    println!("rxe: unpacking {} (once)", rel(&deb).display());
    let partial = kernels.join(format!("{package}.partial"));
    let _ = fs::remove_dir_all(&partial);
    fs::create_dir_all(&partial).map_err(|e| format!("{}: {e}", partial.display()))?;
    util::run(Command::new("dpkg").arg("-x").arg(&deb).arg(&partial))?;
    let dir = kernels.join(package);
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&partial, &dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    fs::write(
        dir.join(".unpacked"),
        deb.file_name().unwrap_or_default().as_encoded_bytes(),
    )
    .map_err(|e| format!("{}: {e}", dir.display()))?;
    // The unpacked tree is the cache; the .deb and older kernels (400 MB each) go.
    let _ = fs::remove_file(&deb);
    let _ = fs::remove_dir(&debs);
    for old in cached_kernels(kernels).into_iter().filter(|k| k != package) {
        println!("rxe: removing the cached {old}");
        let _ = fs::remove_dir_all(kernels.join(old));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apt_depends_names_the_kernel_package() {
        let out = "linux-image-amd64\n  Depends: linux-image-6.1.0-56-amd64\n";
        assert_eq!(
            parse_apt_depends(out).as_deref(),
            Some("linux-image-6.1.0-56-amd64")
        );
        let alternatives = "linux-image-amd64\n |Depends: <linux-image-6.12.9-amd64>\n  Depends: linux-image-6.1.0-1-amd64\n  Recommends: firmware-linux-free\n";
        assert_eq!(
            parse_apt_depends(alternatives).as_deref(),
            Some("linux-image-6.12.9-amd64")
        );
        assert_eq!(
            parse_apt_depends("linux-image-amd64\n  Depends: initramfs-tools\n"),
            None
        );
        assert_eq!(
            parse_apt_depends("  Depends: linux-image-../../etc\n"),
            None
        );
        assert_eq!(parse_apt_depends(""), None);
    }
}
