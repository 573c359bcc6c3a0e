//! The VM: QEMU booting the kernel and initramfs with the share, its console logged and its
//! `@rxe` progress lines printed, under a wall-clock limit.

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::kernel::Kernel;
use crate::util;

pub(super) enum VmEnd {
    Exited(ExitStatus),
    TimedOut,
}

/// Boots the guest, logs its console to `log` (printing its `@rxe` progress lines) and
/// waits for it to power off, at most `timeout`.
pub(super) fn boot(
    kernel: &Kernel,
    initrd: &Path,
    share: &Path,
    log: &Path,
    timeout: Duration,
) -> Result<VmEnd, String> {
    // QEMU option values escape a comma by doubling it.
    let share_opt = share.to_string_lossy().replace(',', ",,");
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args([
        "-accel",
        "tcg,thread=multi",
        "-cpu",
        "max",
        "-m",
        "2G",
        "-smp",
        "2",
    ])
    .args(["-nographic", "-no-reboot"])
    .arg("-kernel")
    .arg(&kernel.vmlinuz)
    .arg("-initrd")
    .arg(initrd)
    .args(["-append", "console=ttyS0 quiet panic=-1", "-nic", "none"])
    .arg("-virtfs")
    .arg(format!(
        "local,path={share_opt},mount_tag=host,security_model=none,id=host"
    ))
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    eprintln!("$ {}", util::show(&cmd));
    let mut log_file = fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("qemu-system-x86_64: {e}"))?;
    let (tx, rx) = mpsc::channel::<String>();
    let readers: Vec<_> = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|stream| {
        let tx = tx.clone();
        thread::spawn(move || {
            let mut reader = BufReader::new(stream);
            let mut line = Vec::new();
            while reader.read_until(b'\n', &mut line).unwrap_or(0) > 0 {
                let text = String::from_utf8_lossy(&line);
                if tx.send(plain(&text)).is_err() {
                    break;
                }
                line.clear();
            }
        })
    })
    .collect();
    drop(tx);

    let mut timed_out = false;
    loop {
        let left = timeout.saturating_sub(started.elapsed());
        match rx.recv_timeout(left.min(Duration::from_millis(500))) {
            Ok(line) => {
                let t = started.elapsed().as_secs_f64();
                let _ = writeln!(log_file, "[{t:8.3}] {line}");
                if let Some(at) = line.find("@rxe ") {
                    println!("  vm {t:6.1}s  {}", &line[at + 5..]);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if started.elapsed() >= timeout {
            timed_out = true;
            let _ = child.kill();
            break;
        }
    }
    let status = child.wait().map_err(|e| format!("qemu: {e}"))?;
    for reader in readers {
        let _ = reader.join();
    }
    for line in rx.try_iter() {
        let _ = writeln!(log_file, "{line}");
    }
    let _ = writeln!(
        log_file,
        "[{:8.3}] host: qemu {}",
        started.elapsed().as_secs_f64(),
        if timed_out {
            "killed (timeout)".to_string()
        } else {
            status.to_string()
        }
    );
    Ok(if timed_out {
        VmEnd::TimedOut
    } else {
        VmEnd::Exited(status)
    })
}

/// A console line without terminal control sequences (SeaBIOS clears the screen, and a
/// printed log must not) or other control characters.
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => {
                // CSI: ESC [ parameters final-byte; anything else: ESC and one character.
                if chars.next_if_eq(&'[').is_some() {
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                } else {
                    chars.next();
                }
            }
            '\t' => out.push(c),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_lines_lose_control_sequences() {
        assert_eq!(
            plain("\u{1b}c\u{1b}[?7l\u{1b}[2J\u{1b}[0mSeaBIOS (version 1.16)\r\n"),
            "SeaBIOS (version 1.16)"
        );
        assert_eq!(
            plain("@rxe step 1/3\tibv_devices\r"),
            "@rxe step 1/3\tibv_devices"
        );
        assert_eq!(plain("plain"), "plain");
    }
}
