//! The binary's behaviour as a user sees it: exit codes, messages, the table, `--json`,
//! `--histogram`. Runs on softnic (`-d softnic`: loopback in this process), so it needs no
//! RDMA device and behaves the same on a machine that has one.

use std::net::TcpListener;
use std::process::{Command, Output};

fn perf(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hotverbs-perf"))
        .args(args)
        .env_remove("HOTVERBS_DEVICE")
        .output()
        .expect("run hotverbs-perf")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn json(args: &[&str]) -> serde_json::Value {
    let mut a = args.to_vec();
    a.push("--json");
    let o = perf(&a);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{args:?} failed: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

#[test]
fn unknown_test_and_bad_numbers_fail_with_usage() {
    for args in [
        &["sned_lat"][..],
        &["send_lat", "-n", "0"],
        &["send_lat", "-n", "many"],
        &["send_lat", "-s", "64", "-a"],
        &["send_lat", "--bogus"],
        &[],
    ] {
        let o = perf(args);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("error:") && err.contains("--help"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn inconsistent_options_fail_with_a_reason() {
    let cases: &[(&[&str], &str)] = &[
        (&["send_lat", "-d", "softnic", "-s", "0"], "size 0"),
        (
            &["send_bw", "-d", "softnic", "-l", "64", "-t", "16"],
            "-l 64",
        ),
        (
            &["send_bw", "-d", "softnic", "-Q", "16", "-t", "16"],
            "-Q 16",
        ),
        (&["atomic_lat", "-d", "softnic", "-s", "64"], "8 bytes"),
        (
            &["send_bw", "-d", "softnic", "--histogram", "x.svg"],
            "--histogram",
        ),
        (&["send_lat", "-d", "no_such_dev0"], "no_such_dev0"),
        (&["send_lat", "-d", "softnic", "-x", "9"], "GID index 9"),
        (&["write_lat", "-d", "softnic", "-e"], "write_lat waits"),
        (
            &["send_bw", "-d", "softnic", "-c", "UD"],
            "send_bw is not offered over UD",
        ),
        (&["read_lat", "-d", "softnic", "-c", "UC"], "UC has no READ"),
        (
            &["send_lat", "-d", "softnic", "-c", "UD", "-a"],
            "fits one MTU",
        ),
        (
            &["send_lat", "-d", "softnic", "-c", "UD", "-s", "2000"],
            "exceeds the 1024 B MTU of softnic",
        ),
        (
            &["send_lat", "-d", "softnic_mlx5", "-c", "UD", "--direct"],
            "--direct runs over RC or UC",
        ),
        (
            &["send_lat", "-d", "softnic_mlx5", "-e", "--direct"],
            "--events arms the CQ",
        ),
        (
            &["send_lat", "-d", "softnic", "-e", "--compare_direct"],
            "--events arms the CQ",
        ),
    ];
    for (args, want) in cases {
        let o = perf(args);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("error:") && err.contains(want),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn unreachable_server_is_an_error_within_the_timeout() {
    // Nothing listens there (bound, never listening, held until the end).
    let (_refusing, addr) = hotverbs::testing::refusing_addr();
    let port = addr.port().to_string();
    let o = perf(&["send_lat", "127.0.0.1", "-p", &port, "--timeout", "1"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("connect to 127.0.0.1:{port}")),
        "{err}"
    );
    // The bounded wait is what ended it (not a hang cut short by something else).
    assert!(err.contains("timed out after 1s"), "{err}");
    assert!(err.contains("start the server"), "{err}");
}

#[test]
fn client_without_a_real_device_is_refused_after_reaching_the_server() {
    // A server that accepts and never answers. Without an RDMA device the client's only
    // device is softnic, which cannot reach another process: a clear error, not a wait on
    // the silent peer. (The silent-peer timeouts themselves are tested in the engine's unit
    // tests and in hotverbs' exchange tests.)
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    // The connection stays open until the client has exited: returned by the join.
    let t = std::thread::spawn(move || l.accept());
    let o = perf(&["send_lat", "127.0.0.1", "-p", &port, "--timeout", "1"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("softnic lives inside one process"), "{err}");
    let accepted = t.join().unwrap();
    assert!(accepted.is_ok(), "{accepted:?}");
}

#[test]
fn send_lat_on_softnic_prints_the_table() {
    let o = perf(&["send_lat", "-d", "softnic", "-n", "1000"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("Send Latency Test"), "{out}");
    assert!(out.contains("t_p99.9[usec]"), "{out}");
    let row = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some("2"))
        .unwrap_or_else(|| panic!("no row for 2 bytes: {out}"));
    let f: Vec<f64> = row.split_whitespace().map(|x| x.parse().unwrap()).collect();
    assert_eq!(f[1], 1000.0);
    // min <= p50 <= p90 <= p99 <= p99.9 <= max
    assert!(f[2..8].windows(2).all(|w| w[0] <= w[1]), "{row}");
}

#[test]
fn embedded_default_says_so_in_one_line() {
    // Only meaningful where no RDMA device exists (this crate's CI machine); with one, the
    // tool would wait as a server.
    if !hotverbs_has_no_real_device() {
        println!("skipped: a real RDMA device exists");
        return;
    }
    let o = perf(&["send_lat", "-n", "100"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let notes: Vec<&str> = err.lines().filter(|l| l.contains("softnic")).collect();
    assert_eq!(notes.len(), 1, "{err}");
    assert!(notes[0].contains("no RDMA device"), "{err}");
    assert!(out.contains("softnic"), "{out}");
}

/// `--direct` (and `--compare_direct`) with no device named and none present: the embedded
/// default is softnic's simulated ConnectX, said in one line.
#[test]
fn embedded_default_for_direct_is_the_simulated_connectx() {
    if !hotverbs_has_no_real_device() {
        println!("skipped: a real RDMA device exists");
        return;
    }
    for mode in ["--direct", "--compare_direct"] {
        let o = perf(&["send_lat", mode, "-n", "100"]);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{mode}: {err}");
        let notes: Vec<&str> = err.lines().filter(|l| l.contains("softnic")).collect();
        assert_eq!(notes.len(), 1, "{mode}: {err}");
        assert!(notes[0].contains("no RDMA device"), "{mode}: {err}");
        assert!(notes[0].contains("softnic_mlx5"), "{mode}: {err}");
        assert!(out.contains("mlx5 direct WQEs"), "{mode}: {out}");
    }
}

fn hotverbs_has_no_real_device() -> bool {
    // /sys/class/infiniband lists kernel RDMA devices; absent or empty means none.
    std::fs::read_dir("/sys/class/infiniband")
        .map(|d| d.count() == 0)
        .unwrap_or(true)
}

/// `-e` (perftest's `--events`): both sides sleep on completion events; the header and
/// `--json` say so, and every test that waits on a CQ runs to the end.
#[test]
fn events_mode_runs_and_says_so() {
    for test in [
        "send_lat",
        "read_lat",
        "atomic_lat",
        "send_bw",
        "write_bw",
        "read_bw",
    ] {
        let v = json(&[test, "-d", "softnic", "-n", "200", "-s", "8", "-e"]);
        assert_eq!(v["events"], true, "{test}: {v}");
        assert!(
            v["note"]
                .as_str()
                .unwrap()
                .contains("sleep on completion events"),
            "{test}: {v}"
        );
        assert!(
            v["results"][0]["iterations"].as_u64().unwrap() >= 200,
            "{test}: {v}"
        );
    }
    let o = perf(&["send_lat", "-d", "softnic", "-n", "100", "--events"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains(" Completions    : events"), "{out}");
    let o = perf(&["send_lat", "-d", "softnic", "-n", "100"]);
    assert!(!text(&o).0.contains("Completions"), "polling says nothing");
    assert_eq!(
        json(&["send_lat", "-d", "softnic", "-n", "100"])["events"],
        false
    );
}

/// `-c UC` / `-c UD` (perftest's): the ping-pongs (and UC's WRITE stream) run over the
/// unreliable transports on both post paths, UD up to a full MTU (the receive slots make room for the GRH); the
/// header and `--json` name the transport.
#[test]
fn unreliable_transports_run_the_ping_pongs() {
    for (test, c, size) in [
        ("send_lat", "UD", "8"),
        ("send_lat", "UD", "1024"),
        ("send_lat", "UC", "8"),
        ("write_lat", "UC", "8"),
        ("write_lat", "UC", "4096"),
        ("write_bw", "UC", "4096"),
    ] {
        for old in [false, true] {
            let mut args = vec![test, "-d", "softnic", "-c", c, "-s", size, "-n", "200"];
            if old {
                args.push("--use_old_post_send");
            }
            let v = json(&args);
            assert_eq!(v["connection"], c, "{args:?}: {v}");
            let r = &v["results"][0];
            assert_eq!(r["iterations"], 200, "{args:?}: {v}");
            if test.ends_with("_lat") {
                assert!(r["t_p50_us"].as_f64().unwrap() > 0.0, "{args:?}: {v}");
            } else {
                assert!(r["mib_per_s"].as_f64().unwrap() > 0.0, "{args:?}: {v}");
            }
        }
    }
    let o = perf(&["send_lat", "-d", "softnic", "-c", "ud", "-n", "100"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("Connection type : UD"), "{out}");
    assert_eq!(
        json(&["send_lat", "-d", "softnic", "-n", "100"])["connection"],
        "RC"
    );
}

#[test]
fn json_has_the_fields_for_every_test() {
    for test in [
        "send_lat",
        "write_lat",
        "read_lat",
        "atomic_lat",
        "send_bw",
        "write_bw",
        "read_bw",
    ] {
        let v = json(&[test, "-d", "softnic", "-n", "200", "-s", "8"]);
        assert_eq!(v["test"], test);
        assert_eq!(v["device"], "softnic");
        assert_eq!(v["role"], "loopback");
        let r = &v["results"][0];
        assert_eq!(r["bytes"], 8, "{test}: {v}");
        assert!(r["iterations"].as_u64().unwrap() >= 200, "{test}: {v}");
        assert!(r["mpps"].as_f64().unwrap() > 0.0, "{test}: {v}");
        assert!(r["gbps"].as_f64().unwrap() > 0.0, "{test}: {v}");
        if test.ends_with("_lat") {
            for k in [
                "t_min_us",
                "t_p50_us",
                "t_p90_us",
                "t_p99_us",
                "t_p999_us",
                "t_max_us",
            ] {
                assert!(r[k].as_f64().unwrap() > 0.0, "{test} {k}: {v}");
            }
            assert!(r["t_min_us"].as_f64() <= r["t_max_us"].as_f64());
            assert_eq!(
                v["latency_is_half_round_trip"],
                test == "send_lat" || test == "write_lat"
            );
        } else {
            assert!(r.get("t_p50_us").is_none(), "{test}: {v}");
            assert!(r["mib_per_s"].as_f64().unwrap() > 0.0);
        }
    }
}

#[test]
fn sizes_options_and_duration() {
    // Every size, zero-copy above the inline limit, post lists and signal period.
    let v = json(&[
        "write_lat",
        "-d",
        "softnic",
        "-a",
        "-n",
        "5",
        "--warmup",
        "1",
    ]);
    let sizes: Vec<u64> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes.first(), Some(&2));
    assert_eq!(sizes.last(), Some(&(8 << 20)));
    assert_eq!(sizes.len(), 23);
    let v = json(&[
        "send_bw", "-d", "softnic", "-s", "64", "-n", "1000", "-l", "8", "-Q", "8", "-t", "64",
        "-I", "64",
    ]);
    assert_eq!(v["params"]["post_list"], 8);
    assert_eq!(v["params"]["inline_size"], 64);
    let v = json(&["read_bw", "-d", "softnic", "-s", "4096", "-D", "0.3"]);
    let r = &v["results"][0];
    assert!(r["seconds"].as_f64().unwrap() >= 0.3, "{v}");
    let v = json(&[
        "atomic_lat",
        "-d",
        "softnic",
        "-A",
        "CMP_AND_SWAP",
        "-n",
        "100",
    ]);
    assert_eq!(v["results"][0]["iterations"], 100);
}

#[test]
fn histogram_is_written() {
    let dir = std::env::temp_dir().join(format!("hotverbs-perf-hist-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("lat.svg");
    let p = path.to_str().unwrap();
    let o = perf(&["read_lat", "-d", "softnic", "-n", "500", "--histogram", p]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("histogram written"), "{out}");
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("p99.9"), "markers drawn");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn compare_direct_is_refused_by_name_off_connectx_outside_loopback_and_with_other_modes() {
    let o = perf(&["send_lat", "-d", "softnic", "--compare_direct", "-n", "10"]);
    let (out, err) = text(&o);
    assert!(!o.status.success());
    assert!(err.contains("softnic is not an mlx5 device"), "{err}");
    assert!(
        err.contains("-d softnic_mlx5"),
        "where it can be seen: {err}"
    );
    assert!(!out.contains("post path"), "nothing ran first: {out}");
    // A named device and no --loopback: the server role, refused before the device opens.
    let o = perf(&["send_lat", "-d", "mlx5_0", "--compare_direct"]);
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(err.contains("--loopback"), "{err}");
    for extra in ["--direct", "--timestamps", "--use_old_post_send", "--json"] {
        let o = perf(&["send_lat", "-d", "softnic", "--compare_direct", extra]);
        let (_, err) = text(&o);
        assert!(!o.status.success());
        assert!(
            err.contains("--compare_direct runs the verbs path"),
            "{extra}: {err}"
        );
    }
}

/// `-d softnic_mlx5`: softnic's simulated ConnectX runs every test kind on the direct path
/// (and `--compare_direct`), so a laptop can see `--direct` work; the header says the
/// times are the simulator's.
#[test]
fn direct_runs_every_test_kind_on_softnic_mlx5() {
    for kind in [
        "send_lat",
        "send_bw",
        "write_lat",
        "write_bw",
        "read_lat",
        "read_bw",
        "atomic_lat",
    ] {
        let o = perf(&[kind, "-d", "softnic_mlx5", "--direct", "-n", "300"]);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{kind}: {err}");
        assert!(out.contains("mlx5 direct WQEs"), "{kind}: {out}");
        assert!(
            out.contains("the times are the simulator's"),
            "{kind}: {out}"
        );
        assert!(
            out.contains(" 300 "),
            "{kind}: a row of 300 iterations: {out}"
        );
    }
    let o = perf(&[
        "send_lat",
        "-d",
        "softnic_mlx5",
        "--compare_direct",
        "-n",
        "300",
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("direct vs verbs"), "{out}");
}

/// `--direct` with a 32-byte message on softnic's simulated ConnectX: `send_lat` runs
/// through a held `DirectSession`, `send_bw` through `DirectRing::post_list` (over RC, and
/// `send_lat` over UC too), every iteration completes, and the header and `--json` name the
/// path and the doorbell register's use: BlueFlame, each QP being in a thread domain of
/// its own (doorbell only, saying why, under softnic's Rxe profile, which has no thread
/// domains, as rxe). A size the fixed-size loops are not compiled for takes the generic
/// direct path, and says so.
#[test]
fn direct_send_tests_take_the_fixed_size_paths_on_softnic_mlx5() {
    let rxe = hotverbs_softnic::Profile::from_env() == hotverbs_softnic::Profile::Rxe;
    let cases: &[(&[&str], &str)] = &[
        (&["send_lat"], "direct session"),
        (&["send_lat", "-c", "UC"], "direct session"),
        (&["send_bw"], "direct post_list"),
        (&["send_bw", "-l", "8", "-q", "2"], "direct post_list"),
    ];
    for &(test, path) in cases {
        let mut args = test.to_vec();
        args.extend(["-d", "softnic_mlx5", "--direct", "-s", "32", "-n", "300"]);
        let o = perf(&args);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{args:?}: {err}");
        assert!(
            out.contains("Post path      : mlx5 direct WQEs"),
            "{args:?}: {out}"
        );
        assert!(
            out.contains(&format!(" Direct path    : {path}\n")),
            "{args:?}: {out}"
        );
        let register = if rxe {
            " Register       : doorbell only: the QP is in no thread domain"
        } else {
            " Register       : BlueFlame (first buffer at +0)"
        };
        assert!(out.contains(register), "{args:?}: {out}");
        let row = out
            .lines()
            .find(|l| l.starts_with(" 32 "))
            .unwrap_or_else(|| panic!("{args:?}: no row for 32 B: {out}"));
        let f: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(f[1], "300", "{args:?}: every iteration completed: {row}");
        let v = json(&args);
        let r = &v["results"][0];
        assert_eq!(r["iterations"], 300, "{args:?}: {v}");
        assert_eq!(r["direct_path"], path, "{args:?}: {v}");
        assert!(r["mpps"].as_f64().unwrap() > 0.0, "{args:?}: {v}");
        assert_eq!(v["register_use"]["blueflame"], !rxe, "{args:?}: {v}");
        if rxe {
            assert_eq!(v["register_use"]["reason"], "SharedRegister", "{v}");
        }
    }
    // 33 bytes: no fixed-size loop; the generic direct path.
    for (test, path) in [("send_lat", "direct send_now"), ("send_bw", "direct batch")] {
        let v = json(&[
            test,
            "-d",
            "softnic_mlx5",
            "--direct",
            "-s",
            "33",
            "-n",
            "300",
        ]);
        assert_eq!(v["results"][0]["iterations"], 300, "{test}: {v}");
        assert_eq!(v["results"][0]["direct_path"], path, "{test}: {v}");
    }
    // Not --direct: no direct path, no register.
    let v = json(&["send_lat", "-d", "softnic", "-s", "32", "-n", "10"]);
    assert!(v["results"][0].get("direct_path").is_none(), "{v}");
    assert_eq!(v["register_use"], serde_json::Value::Null, "{v}");
}

#[test]
fn direct_is_refused_by_name_off_connectx_and_with_other_paths() {
    let o = perf(&["send_lat", "-d", "softnic", "--direct", "-n", "10"]);
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(err.contains("--direct"), "{err}");
    assert!(err.contains("softnic is not an mlx5 device"), "{err}");
    assert!(
        err.contains("-d softnic_mlx5"),
        "where it can be seen: {err}"
    );
    for extra in ["--timestamps", "--use_old_post_send"] {
        let o = perf(&["send_lat", "-d", "softnic", "--direct", extra]);
        let (_, err) = text(&o);
        assert!(!o.status.success());
        assert!(err.contains(extra), "{extra}: {err}");
    }
}

/// `-q N` (perftest's): N QPs per side share the CQ, on every bandwidth test and post path;
/// each QP completes a share of the messages (every count above zero, their sum the
/// total), `--json` has the counts and the fairness figures, the table a row for them.
#[test]
fn several_qps_share_a_bandwidth_test() {
    for test in ["write_bw", "send_bw", "read_bw"] {
        for extra in [&[][..], &["--use_old_post_send"]] {
            let mut args = vec![test, "-d", "softnic", "-q", "4", "-n", "400", "-s", "256"];
            args.extend(extra);
            let v = json(&args);
            assert_eq!(v["params"]["qps"], 4, "{args:?}: {v}");
            let r = &v["results"][0];
            assert_eq!(r["iterations"], 400, "{args:?}: {v}");
            let per_qp: Vec<u64> = r["per_qp_iterations"]
                .as_array()
                .unwrap_or_else(|| panic!("{args:?}: no per_qp_iterations: {v}"))
                .iter()
                .map(|c| c.as_u64().unwrap())
                .collect();
            assert_eq!(per_qp.len(), 4, "{args:?}: {v}");
            assert!(per_qp.iter().all(|&c| c > 0), "{args:?}: {per_qp:?}");
            assert_eq!(per_qp.iter().sum::<u64>(), 400, "{args:?}: {per_qp:?}");
            let f = &r["qp_fairness"];
            let jain = f["jain_index"].as_f64().unwrap();
            let min_max = f["min_over_max"].as_f64().unwrap();
            assert!((0.25..=1.0).contains(&jain), "{args:?}: {f}");
            assert!(min_max > 0.0 && min_max <= 1.0, "{args:?}: {f}");
            let (min, max) = (per_qp.iter().min().unwrap(), per_qp.iter().max().unwrap());
            assert_eq!(min_max, *min as f64 / *max as f64, "{args:?}: {f}");
            assert!(r["mib_per_s"].as_f64().unwrap() > 0.0, "{args:?}: {v}");
        }
    }
    let o = perf(&["write_bw", "-d", "softnic", "-q", "4", "-n", "400"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains(" Number of qps  : 4 "), "{out}");
    let row = out
        .lines()
        .find(|l| l.contains("(4 QPs)"))
        .unwrap_or_else(|| panic!("no per-QP row: {out}"));
    assert!(
        row.contains("per QP: min") && row.contains("Jain's index"),
        "{row}"
    );
    // One QP: the table as before, no per-QP row.
    let o = perf(&["write_bw", "-d", "softnic", "-n", "400"]);
    let (out, _) = text(&o);
    assert!(out.contains(" Number of qps  : 1 "), "{out}");
    assert!(!out.contains("per QP"), "{out}");
}

/// `-q` with `--direct`: the one direct poller serves the send queues of every QP (up to
/// its limit, 8).
#[test]
fn several_qps_on_the_direct_path() {
    for test in ["write_bw", "send_bw"] {
        let v = json(&[
            test,
            "-d",
            "softnic_mlx5",
            "--direct",
            "-q",
            "8",
            "-n",
            "400",
            "-s",
            "64",
        ]);
        assert_eq!(v["post_path"], "mlx5 direct WQEs", "{test}: {v}");
        let per_qp = v["results"][0]["per_qp_iterations"].as_array().unwrap();
        assert_eq!(per_qp.len(), 8, "{test}: {v}");
        assert!(
            per_qp.iter().all(|c| c.as_u64().unwrap() > 0),
            "{test}: {v}"
        );
    }
}

/// `-q` where it cannot work is refused by name: a latency test (one operation in flight,
/// as perftest), more QPs than the direct poller serves, fewer messages than QPs, more
/// completions than one CQ holds, more QPs than there are ring ids for.
#[test]
fn qps_are_refused_by_name_where_they_cannot_work() {
    for test in ["send_lat", "write_lat", "read_lat", "atomic_lat"] {
        let o = perf(&[test, "-d", "softnic", "-q", "2"]);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{test}: {err}");
        assert!(
            err.contains(&format!("-q 2: {test} is a latency test")),
            "{test}: {err}"
        );
    }
    let o = perf(&["write_bw", "-d", "softnic_mlx5", "--direct", "-q", "9"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("at most 8 QPs"), "{err}");
    let o = perf(&["write_bw", "-d", "softnic", "-q", "8", "-n", "4"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("use -n 8 or more"), "{err}");
    // More completions than one CQ holds (softnic's max_cqe is 32767, as rxe's): named,
    // with what to lower.
    let o = perf(&[
        "send_bw", "-d", "softnic", "-q", "64", "-r", "4096", "-s", "64",
    ]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("share one CQ of") && err.contains("lower -q, -t or -r"),
        "{err}"
    );
    // Beyond the ring ids (64): clap's range check, a usage error.
    let o = perf(&["write_bw", "-d", "softnic", "-q", "65"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o).1);
}

/// `write_lat --write_with_imm` (perftest's option): each WRITE carries an immediate and
/// each side waits for the receive completion the peer's raises, on the verbs path and on
/// the direct path (softnic's simulated ConnectX: the WRITE posted as an mlx5 WQE, the
/// receive posted and its responder CQE read directly); the header and `--json` say so,
/// and every iteration completes. Other tests refuse the option by name.
#[test]
fn write_lat_with_immediate_runs_on_both_paths() {
    for extra in [
        &["-d", "softnic"][..],
        &["-d", "softnic_mlx5", "--direct"][..],
    ] {
        let mut args = vec!["write_lat", "--write_with_imm", "-s", "64", "-n", "300"];
        args.extend(extra);
        let o = perf(&args);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{args:?}: {err}");
        assert!(
            out.contains(" Write mode     : WRITE with immediate"),
            "{out}"
        );
        let row = out
            .lines()
            .find(|l| l.starts_with(" 64 "))
            .unwrap_or_else(|| panic!("{args:?}: no row for 64 B: {out}"));
        let f: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(f[1], "300", "{args:?}: every iteration completed: {row}");
        let v = json(&args);
        assert_eq!(v["params"]["write_with_imm"], true, "{v}");
        assert_eq!(v["results"][0]["iterations"], 300, "{v}");
    }
    let o = perf(&["send_lat", "--write_with_imm", "-d", "softnic"]);
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(err.contains("--write_with_imm"), "{err}");
}
