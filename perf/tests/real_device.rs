//! hotverbs-perf on a real RDMA device (rxe under `cargo xtask rxe`): every test as server
//! and client over 127.0.0.1, and loopback on the device. Without a device this prints
//! "skipped: no RDMA device" — unless HOTVERBS_RXE=1, where a missing device is a failure
//! (the probe is `hotverbs::testing::real_device`: $HOTVERBS_DEVICE, else the first real
//! device; GID index $HOTVERBS_GID_INDEX).

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;

struct Dev {
    name: String,
    gid_index: Option<String>,
}

fn device() -> Option<Dev> {
    // One probe policy for every real-device test of the workspace (hotverbs::testing).
    let ctx = hotverbs::testing::real_device()?;
    Some(Dev {
        name: ctx.name().to_string(),
        gid_index: hotverbs::testing::gid_index().map(|g| g.to_string()),
    })
}

/// The perf binary: `HOTVERBS_PERF_BIN` (set by `cargo xtask rxe`, which ships the binary
/// into the VM), else the one cargo built next to this test.
fn perf_bin() -> String {
    std::env::var("HOTVERBS_PERF_BIN")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_hotverbs-perf").to_string())
}

fn dev_args(d: &Dev) -> Vec<String> {
    let mut v = vec!["-d".to_string(), d.name.clone()];
    if let Some(g) = &d.gid_index {
        v.extend(["-x".to_string(), g.clone()]);
    }
    v
}

/// What the server prints on stderr once it listens, when started with `-p 0`
/// (`LISTENING` in src/run.rs), followed by the port.
const LISTENING: &str = "hotverbs-perf: listening on TCP port ";

/// A perf server started with `-p 0`: the kernel picks a free port, so concurrent runs never
/// collide, and the client starts only once the server listens there.
struct Server {
    child: Child,
    port: String,
    /// The rest of its stderr, read as it comes so the server never blocks on a full pipe.
    stderr: JoinHandle<String>,
}

impl Server {
    /// Starts `bin args -p 0` and waits until it says which port it listens on.
    fn start(bin: &str, args: &[String]) -> Server {
        let mut child = Command::new(bin)
            .args(args)
            .args(["-p", "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap());
        let mut seen = String::new();
        let port = loop {
            let mut line = String::new();
            if lines.read_line(&mut line).unwrap() == 0 {
                let st = child.wait().unwrap();
                panic!("the server ({args:?}) exited with {st} before listening: {seen}");
            }
            seen.push_str(&line);
            if let Some(port) = line.trim_end().strip_prefix(LISTENING) {
                break port.to_string();
            }
        };
        let stderr = std::thread::spawn(move || {
            let _ = lines.read_to_string(&mut seen);
            seen
        });
        Server {
            child,
            port,
            stderr,
        }
    }

    /// Waits for the server to exit: its status, stdout and stderr.
    fn wait(self) -> (ExitStatus, Vec<u8>, String) {
        let out = self.child.wait_with_output().unwrap();
        (out.status, out.stdout, self.stderr.join().unwrap())
    }
}

#[test]
fn every_test_as_server_and_client_on_localhost() {
    let Some(d) = device() else { return };
    let bin = perf_bin();
    for test in [
        "send_lat",
        "write_lat",
        "read_lat",
        "atomic_lat",
        "send_bw",
        "write_bw",
        "read_bw",
    ] {
        let common = |extra: &[&str]| {
            let mut v: Vec<String> = vec![test.into()];
            v.extend(extra.iter().map(|s| s.to_string()));
            v.extend(dev_args(&d));
            v.extend(
                ["-n", "200", "--json", "--timeout", "20"]
                    .iter()
                    .map(|s| s.to_string()),
            );
            v
        };
        let server = Server::start(&bin, &common(&["--server-wait", "60"]));
        let client = Command::new(&bin)
            .args(common(&["127.0.0.1", "-p", &server.port]))
            .output()
            .unwrap();
        let (server_status, server_stdout, serr) = server.wait();
        let cerr = String::from_utf8_lossy(&client.stderr);
        assert!(
            client.status.success(),
            "{test} client: {cerr}\nserver: {serr}"
        );
        assert!(
            server_status.success(),
            "{test} server: {serr}\nclient: {cerr}"
        );
        let v: serde_json::Value = serde_json::from_slice(&client.stdout).unwrap();
        assert_eq!(v["role"], "client");
        assert_eq!(v["device"], d.name.as_str());
        assert!(
            v["results"][0]["mpps"].as_f64().unwrap() > 0.0,
            "{test}: {v}"
        );
        let s: serde_json::Value = serde_json::from_slice(&server_stdout).unwrap();
        assert_eq!(s["role"], "server");
        assert_eq!(
            s["results"], v["results"],
            "the server reports the client's results"
        );
        println!("{test}: {}", v["results"][0]);
    }
}

/// `-q 4` between two processes on the device: every QP's endpoint through the exchange,
/// every QP completing a share, and the server reporting the client's per-QP counts.
#[test]
fn several_qps_as_server_and_client_on_localhost() {
    let Some(d) = device() else { return };
    let bin = perf_bin();
    for test in ["send_bw", "write_bw", "read_bw"] {
        let common = |extra: &[&str]| {
            let mut v: Vec<String> = vec![test.into()];
            v.extend(extra.iter().map(|s| s.to_string()));
            v.extend(dev_args(&d));
            v.extend(
                [
                    "-q",
                    "4",
                    "-n",
                    "400",
                    "-s",
                    "4096",
                    "--json",
                    "--timeout",
                    "20",
                ]
                .iter()
                .map(|s| s.to_string()),
            );
            v
        };
        let server = Server::start(&bin, &common(&["--server-wait", "60"]));
        let client = Command::new(&bin)
            .args(common(&["127.0.0.1", "-p", &server.port]))
            .output()
            .unwrap();
        let (server_status, server_stdout, serr) = server.wait();
        let cerr = String::from_utf8_lossy(&client.stderr);
        assert!(
            client.status.success() && server_status.success(),
            "{test} client: {cerr}\nserver: {serr}"
        );
        let v: serde_json::Value = serde_json::from_slice(&client.stdout).unwrap();
        let per_qp: Vec<u64> = v["results"][0]["per_qp_iterations"]
            .as_array()
            .unwrap_or_else(|| panic!("{test}: no per_qp_iterations: {v}"))
            .iter()
            .map(|c| c.as_u64().unwrap())
            .collect();
        assert_eq!(per_qp.len(), 4, "{test}: {v}");
        assert!(per_qp.iter().all(|&c| c > 0), "{test}: {v}");
        assert_eq!(per_qp.iter().sum::<u64>(), 400, "{test}: {v}");
        let s: serde_json::Value = serde_json::from_slice(&server_stdout).unwrap();
        assert_eq!(s["results"], v["results"], "{test}");
        println!("{test} -q 4: {}", v["results"][0]);
    }
}

#[test]
fn loopback_on_the_device() {
    let Some(d) = device() else { return };
    let mut args = vec!["send_lat".to_string(), "--loopback".into()];
    args.extend(dev_args(&d));
    args.extend(["-n".into(), "200".into(), "--json".into()]);
    let o = Command::new(perf_bin()).args(&args).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["role"], "loopback");
    assert!(v["results"][0]["t_p50_us"].as_f64().unwrap() > 0.0);
}

#[test]
fn mismatched_tests_are_refused_on_both_sides() {
    let Some(d) = device() else { return };
    let bin = perf_bin();
    let mut s = vec!["write_lat".to_string(), "--server-wait".into(), "60".into()];
    s.extend(dev_args(&d));
    let server = Server::start(&bin, &s);
    let mut c = vec![
        "send_lat".to_string(),
        "127.0.0.1".into(),
        "-p".into(),
        server.port.clone(),
    ];
    c.extend(dev_args(&d));
    let client = Command::new(&bin).args(&c).output().unwrap();
    let (server_status, _, serr) = server.wait();
    let cerr = String::from_utf8_lossy(&client.stderr);
    assert_eq!(client.status.code(), Some(1), "client: {cerr}");
    assert_eq!(server_status.code(), Some(1), "server: {serr}");
    assert!(cerr.contains("refused"), "client: {cerr}");
}

/// `--compare_direct` on a ConnectX: both post paths in one command, both tables and the
/// comparison; on any other device refused by name before anything runs.
#[test]
fn compare_direct_on_the_device() {
    let Some(d) = device() else { return };
    let mlx5 = hotverbs::Context::open(&d.name)
        .map(|c| c.is_mlx5())
        .unwrap_or(false);
    for test in ["send_lat", "write_bw"] {
        let mut args = vec![
            test.to_string(),
            "--loopback".into(),
            "--compare_direct".into(),
        ];
        args.extend(dev_args(&d));
        args.extend(["-n".into(), "500".into(), "--no-progress".into()]);
        let o = Command::new(perf_bin()).args(&args).output().unwrap();
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
        );
        if !mlx5 {
            assert!(
                !o.status.success(),
                "{test}: --compare_direct ran on {}",
                d.name
            );
            assert!(err.contains("not an mlx5 device"), "{test}: {err}");
            assert!(!out.contains("post path"), "{test}: {out}");
            continue;
        }
        assert!(o.status.success(), "{test}: {err}");
        assert!(out.contains("post path 1 of 2: verbs"), "{test}: {out}");
        assert!(out.contains("post path 2 of 2: --direct"), "{test}: {out}");
        let last = out.lines().last().unwrap_or("");
        let ratio: f64 = last
            .split_whitespace()
            .last()
            .and_then(|r| r.parse().ok())
            .unwrap_or(f64::NAN);
        assert!(ratio.is_finite() && ratio > 0.0, "{test}: {out}");
    }
}

/// `--direct` on a ConnectX (the mlx5 direct path, every test kind in loopback); on any
/// other device it must be refused by name.
#[test]
fn direct_on_the_device() {
    let Some(d) = device() else { return };
    let mlx5 = hotverbs::Context::open(&d.name)
        .map(|c| c.is_mlx5())
        .unwrap_or(false);
    for test in [
        "send_lat",
        "write_lat",
        "read_lat",
        "atomic_lat",
        "send_bw",
        "write_bw",
    ] {
        let mut args = vec![test.to_string(), "--loopback".into(), "--direct".into()];
        args.extend(dev_args(&d));
        args.extend(["-n".into(), "500".into(), "--json".into()]);
        let o = Command::new(perf_bin()).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        if !mlx5 {
            assert!(!o.status.success(), "{test}: --direct ran on {}", d.name);
            assert!(err.contains("not an mlx5 device"), "{test}: {err}");
            continue;
        }
        assert!(o.status.success(), "{test}: {err}");
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["post_path"], "mlx5 direct WQEs", "{test}");
    }
}
