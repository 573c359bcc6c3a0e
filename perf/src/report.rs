//! Output: perftest's table (a header block, one row per size printed as the size finishes,
//! a closing rule) and the `--json` document.

use serde_json::{json, Value};

use crate::cli::{Amount, Params, TestKind};
use crate::stats::{Fairness, LatencySummary, Throughput};

const RULE: &str =
    "---------------------------------------------------------------------------------------";

/// Where the two sides of the run are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Both sides in this process.
    Loopback,
    /// This process waited for a client.
    Server,
    /// This process connected to a server.
    Client,
}

impl Role {
    /// Name in the header and `--json`.
    pub fn name(self) -> &'static str {
        match self {
            Role::Loopback => "loopback",
            Role::Server => "server",
            Role::Client => "client",
        }
    }
}

/// Facts about the run shown above the table.
#[derive(Clone, Debug)]
pub struct RunInfo {
    /// Device name (`softnic`, `rxe0`, ...).
    pub device: String,
    /// Port used.
    pub ib_port: u8,
    /// GID index used, if any.
    pub gid_index: Option<u8>,
    /// Active MTU in bytes.
    pub mtu: u32,
    /// `IB` or `Ethernet` (RoCE), as the port reports it.
    pub link_layer: String,
    /// The role of this process.
    pub role: Role,
    /// Inline threshold in force.
    pub inline_size: u32,
    /// Signal period of the send ring in force.
    pub signal_every: u32,
    /// The clock of the latency samples (`"TSC 2595.9 MHz"`).
    pub clock: String,
    /// How the ping-pong sides run (for loopback), e.g. "two threads, busy polling".
    pub note: Option<String>,
    /// The post path: `ibv_wr_*` (extended QP, the default) or `ibv_post_send`
    /// (`--use_old_post_send`).
    pub post_path: String,
    /// `--timestamps`: the device clock the NIC-clock row is read with.
    pub nic_clock: Option<String>,
    /// `--events`: this side sleeps on completion events instead of busy polling.
    pub events: bool,
    /// `--direct`: how this side's rings ring their QPs' doorbell registers (BlueFlame, or
    /// the doorbell alone and why).
    pub register: Option<hotverbs::RegisterUse>,
    /// `--direct`: which of the direct path's APIs posts each size's messages
    /// (`"direct session"`, `"direct post_list"`, `"direct send_now"`, `"direct batch"`),
    /// in size order; empty on the other post paths.
    pub direct_paths: Vec<(u32, &'static str)>,
}

impl RunInfo {
    /// The direct path that posted `bytes`-byte messages, if this is a `--direct` run.
    pub fn direct_path(&self, bytes: u32) -> Option<&'static str> {
        self.direct_paths
            .iter()
            .find(|(s, _)| *s == bytes)
            .map(|(_, p)| *p)
    }
}

/// The header's `Direct path` value: the one path, or each path with the sizes it took
/// (consecutive sizes grouped), e.g. `direct session (2..32 B), direct send_now (64..8388608 B)`.
pub fn direct_paths_line(v: &[(u32, &'static str)]) -> String {
    let mut runs: Vec<(u32, u32, &str)> = Vec::new();
    for &(size, path) in v {
        match runs.last_mut() {
            Some(r) if r.2 == path => r.1 = size,
            _ => runs.push((size, size, path)),
        }
    }
    if runs.len() == 1 {
        return runs[0].2.to_string();
    }
    runs.iter()
        .map(|&(a, b, p)| {
            if a == b {
                format!("{p} ({a} B)")
            } else {
                format!("{p} ({a}..{b} B)")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `--json`'s `register_use`: `blueflame`, the reason of a doorbell-only ring (its
/// `DoorbellOnly` name) and the sentence the header prints.
fn register_json(r: Option<hotverbs::RegisterUse>) -> Value {
    match r {
        None => Value::Null,
        Some(r) => json!({
            "blueflame": matches!(r, hotverbs::RegisterUse::BlueFlame { .. }),
            "reason": match r {
                hotverbs::RegisterUse::BlueFlame { .. } => None,
                hotverbs::RegisterUse::DoorbellOnly(why) => Some(format!("{why:?}")),
            },
            "text": r.to_string(),
        }),
    }
}

/// One finished size.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SizeResult {
    /// Message size.
    pub bytes: u32,
    /// Measured iterations (messages for bandwidth tests).
    pub iterations: u64,
    /// Latency percentiles (latency tests).
    pub latency: Option<LatencySummary>,
    /// `--timestamps`: the same iterations by the device's completion timestamps.
    #[serde(default)]
    pub nic_latency: Option<LatencySummary>,
    /// Rates over the measured interval.
    pub throughput: Throughput,
    /// Bandwidth tests: the measured messages each QP completed (`-q`), in QP order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_qp: Vec<u64>,
}

fn kv(a: &str, b: &str, c: &str, d: &str) -> String {
    format!(" {a:<15}: {b:<18} {c:<16}: {d}\n")
}

/// The header block.
pub fn header(p: &Params, info: &RunInfo) -> String {
    let mut s = String::new();
    s.push_str(RULE);
    s.push('\n');
    s.push_str(&format!("{:^87}\n", p.test.title()));
    s.push_str(&kv("Device", &info.device, "Role", info.role.name()));
    s.push_str(&kv(
        "Link layer",
        &info.link_layer,
        "Connection type",
        p.connection.name(),
    ));
    s.push_str(&kv(
        "Number of qps",
        &p.qps.to_string(),
        "Port",
        &info.ib_port.to_string(),
    ));
    let gid = info.gid_index.map_or("-".to_string(), |g| g.to_string());
    s.push_str(&kv("Mtu", &format!("{}[B]", info.mtu), "GID index", &gid));
    s.push_str(&kv(
        "TX depth",
        &crate::engine::send_depth(p).to_string(),
        "RX depth",
        &crate::engine::recv_count(p).to_string(),
    ));
    s.push_str(&kv(
        "Inline data",
        &format!("{}[B]", info.inline_size),
        "Signal period",
        &info.signal_every.to_string(),
    ));
    let amount = match p.amount {
        Amount::Iters(n) => format!("{n} iterations"),
        Amount::Seconds(d) => format!("{d} s"),
    };
    s.push_str(&kv(
        "Post list",
        &p.post_list.to_string(),
        "Amount",
        &amount,
    ));
    if p.test == TestKind::AtomicLat {
        s.push_str(&format!(" Atomic type    : {:?}\n", p.atomic));
    }
    if p.write_imm {
        s.push_str(" Write mode     : WRITE with immediate (each side waits for the receive completion it raises)\n");
    }
    s.push_str(&format!(" Clock          : {}\n", info.clock));
    s.push_str(&format!(" Post path      : {}\n", info.post_path));
    if !info.direct_paths.is_empty() {
        s.push_str(&format!(
            " Direct path    : {}\n",
            direct_paths_line(&info.direct_paths)
        ));
    }
    if let Some(r) = info.register {
        s.push_str(&format!(" Register       : {r}\n"));
    }
    if info.events {
        s.push_str(" Completions    : events (ibv_req_notify_cq, ibv_get_cq_event)\n");
    }
    if let Some(c) = &info.nic_clock {
        s.push_str(&format!(" NIC clock      : {c}\n"));
    }
    if let Some(n) = &info.note {
        s.push_str(&format!(" Note           : {n}\n"));
    }
    s.push_str(RULE);
    s.push('\n');
    s.push_str(&columns(p.test));
    s
}

fn columns(t: TestKind) -> String {
    if t.is_latency() {
        format!(
            " {:<8} {:<12} {:>11} {:>11} {:>11} {:>11} {:>13} {:>11} {:>11} {:>13} {:>13}\n",
            "#bytes",
            "#iterations",
            "t_min[usec]",
            "t_p50[usec]",
            "t_p90[usec]",
            "t_p99[usec]",
            "t_p99.9[usec]",
            "t_max[usec]",
            "t_avg[usec]",
            "t_stdev[usec]",
            "MsgRate[Mpps]"
        )
    } else {
        format!(
            " {:<8} {:<12} {:>20} {:>14} {:>14}\n",
            "#bytes", "#iterations", "BW average[MiB/sec]", "BW[Gb/sec]", "MsgRate[Mpps]"
        )
    }
}

/// One row of the table.
pub fn row(t: TestKind, r: &SizeResult) -> String {
    match (&r.latency, t.is_latency()) {
        (Some(l), true) => format!(
            " {:<8} {:<12} {:>11.2} {:>11.2} {:>11.2} {:>11.2} {:>13.2} {:>11.2} {:>11.2} {:>13.2} {:>13.6}\n",
            r.bytes,
            r.iterations,
            l.min,
            l.p50,
            l.p90,
            l.p99,
            l.p999,
            l.max,
            l.avg,
            l.stdev,
            r.throughput.mpps
        ),
        _ => format!(
            " {:<8} {:<12} {:>20.2} {:>14.3} {:>14.6}\n",
            r.bytes, r.iterations, r.throughput.mib_per_s, r.throughput.gbps, r.throughput.mpps
        ),
    }
}

/// The `--timestamps` row under a latency row: the same columns, timed by the device's
/// completion timestamps.
pub fn nic_row(r: &SizeResult) -> Option<String> {
    let l = r.nic_latency.as_ref()?;
    Some(format!(
        " {:<8} {:<12} {:>11.2} {:>11.2} {:>11.2} {:>11.2} {:>13.2} {:>11.2} {:>11.2} {:>13.2}\n",
        "", "(NIC clock)", l.min, l.p50, l.p90, l.p99, l.p999, l.max, l.avg, l.stdev
    ))
}

/// The `-q` row under a bandwidth row (several QPs only): how the messages were shared,
/// the least and the most any QP completed, and their fairness.
pub fn qp_row(r: &SizeResult) -> Option<String> {
    let f = Fairness::of(&r.per_qp).filter(|_| r.per_qp.len() > 1)?;
    let (min, max) = (r.per_qp.iter().min()?, r.per_qp.iter().max()?);
    Some(format!(
        " {:<8} {:<12} per QP: min {min} max {max} messages, min/max {:.3}, Jain's index {:.4}\n",
        "",
        format!("({} QPs)", r.per_qp.len()),
        f.min_max,
        f.jain
    ))
}

/// The closing rule.
pub fn footer() -> String {
    format!("{RULE}\n")
}

/// The `--json` document. Field names are stable: the rxe harness reads them. A bandwidth
/// result also has `per_qp_iterations` (the measured messages each QP completed, in QP
/// order; they add up to `iterations`) and `qp_fairness`: `jain_index` (Jain's fairness
/// index of those counts, 1 = even, 1/N = one QP did everything) and `min_over_max`.
pub fn json(p: &Params, info: &RunInfo, results: &[SizeResult]) -> Value {
    let rows: Vec<Value> = results
        .iter()
        .map(|r| {
            let mut v = json!({
                "bytes": r.bytes,
                "iterations": r.iterations,
                "seconds": r.throughput.seconds,
                "mib_per_s": r.throughput.mib_per_s,
                "gbps": r.throughput.gbps,
                "mpps": r.throughput.mpps,
            });
            if let Some(l) = &r.latency {
                let o = v.as_object_mut().expect("json! object");
                o.insert("t_min_us".into(), json!(l.min));
                o.insert("t_p50_us".into(), json!(l.p50));
                o.insert("t_p90_us".into(), json!(l.p90));
                o.insert("t_p99_us".into(), json!(l.p99));
                o.insert("t_p999_us".into(), json!(l.p999));
                o.insert("t_max_us".into(), json!(l.max));
                o.insert("t_avg_us".into(), json!(l.avg));
                o.insert("t_stdev_us".into(), json!(l.stdev));
            }
            if let Some(path) = info.direct_path(r.bytes) {
                let o = v.as_object_mut().expect("json! object");
                o.insert("direct_path".into(), json!(path));
            }
            if let Some(f) = Fairness::of(&r.per_qp) {
                let o = v.as_object_mut().expect("json! object");
                o.insert("per_qp_iterations".into(), json!(r.per_qp));
                o.insert(
                    "qp_fairness".into(),
                    json!({ "jain_index": f.jain, "min_over_max": f.min_max }),
                );
            }
            if let Some(l) = &r.nic_latency {
                let o = v.as_object_mut().expect("json! object");
                o.insert(
                    "nic".into(),
                    json!({
                        "t_min_us": l.min, "t_p50_us": l.p50, "t_p90_us": l.p90,
                        "t_p99_us": l.p99, "t_p999_us": l.p999, "t_max_us": l.max,
                        "t_avg_us": l.avg, "t_stdev_us": l.stdev,
                    }),
                );
            }
            v
        })
        .collect();
    json!({
        "tool": "hotverbs-perf",
        "version": env!("CARGO_PKG_VERSION"),
        "test": p.test.name(),
        "device": info.device,
        "role": info.role.name(),
        "ib_port": info.ib_port,
        "gid_index": info.gid_index,
        "mtu": info.mtu,
        "clock": info.clock,
        "link_layer": info.link_layer,
        "connection": p.connection.name(),
        "latency_is_half_round_trip": p.test.is_ping_pong(),
        "params": {
            "inline_size": info.inline_size,
            "signal_every": info.signal_every,
            "cq_mod": p.cq_mod,
            "post_list": p.post_list,
            "tx_depth": p.tx_depth,
            "rx_depth": p.rx_depth,
            "qps": p.qps,
            "write_with_imm": p.write_imm,
            "warmup": p.warmup,
            "amount": p.amount,
        },
        "note": info.note,
        "post_path": info.post_path,
        "register_use": register_json(info.register),
        "nic_clock": info.nic_clock,
        "events": info.events,
        "results": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::AtomicKind;

    fn params(test: TestKind) -> Params {
        Params {
            test,
            sizes: vec![2],
            amount: Amount::Iters(1000),
            warmup: 100,
            inline_size: None,
            cq_mod: 16,
            post_list: 1,
            tx_depth: 128,
            rx_depth: 512,
            atomic: AtomicKind::FetchAndAdd,
            connection: Default::default(),
            qps: 1,
            write_imm: false,
        }
    }

    fn info() -> RunInfo {
        RunInfo {
            device: "softnic".into(),
            ib_port: 1,
            gid_index: None,
            mtu: 4096,
            link_layer: "IB".into(),
            role: Role::Loopback,
            inline_size: 220,
            signal_every: 1,
            clock: "TSC 1000.0 MHz".into(),
            note: None,
            post_path: "ibv_wr_*".into(),
            nic_clock: None,
            events: false,
            register: None,
            direct_paths: Vec::new(),
        }
    }

    fn lat_result() -> SizeResult {
        SizeResult {
            bytes: 2,
            iterations: 1000,
            latency: Some(LatencySummary {
                min: 1.0,
                p50: 1.5,
                p90: 2.0,
                p99: 3.0,
                p999: 4.0,
                max: 5.0,
                avg: 1.6,
                stdev: 0.2,
            }),
            nic_latency: None,
            throughput: Throughput {
                seconds: 0.0032,
                mib_per_s: 0.6,
                gbps: 0.005,
                mpps: 0.31,
            },
            per_qp: Vec::new(),
        }
    }

    #[test]
    fn latency_table_has_the_percentile_columns() {
        let h = header(&params(TestKind::SendLat), &info());
        assert!(h.contains("Send Latency Test"));
        for c in [
            "t_min", "t_p50", "t_p90", "t_p99[", "t_p99.9", "t_max", "MsgRate",
        ] {
            assert!(h.contains(c), "{c} missing in {h}");
        }
        let r = row(TestKind::SendLat, &lat_result());
        let f: Vec<&str> = r.split_whitespace().collect();
        assert_eq!(
            f[..9],
            ["2", "1000", "1.00", "1.50", "2.00", "3.00", "4.00", "5.00", "1.60"]
        );
        assert!(h.contains("Post path      : ibv_wr_*"), "{h}");
        assert!(
            nic_row(&lat_result()).is_none(),
            "no NIC row without --timestamps"
        );
    }

    /// `--direct`: the header names the direct API of each size and the register's use,
    /// `--json` has them per row and as `register_use`.
    #[test]
    fn direct_path_and_register_in_header_and_json() {
        use hotverbs::{DoorbellOnly, RegisterUse};
        let mut i = info();
        i.direct_paths = vec![
            (2, "direct session"),
            (32, "direct session"),
            (64, "direct send_now"),
        ];
        i.register = Some(RegisterUse::DoorbellOnly(DoorbellOnly::SharedRegister));
        let h = header(&params(TestKind::SendLat), &i);
        assert!(
            h.contains(" Direct path    : direct session (2..32 B), direct send_now (64 B)"),
            "{h}"
        );
        assert!(
            h.contains(" Register       : doorbell only: the QP is in no thread domain"),
            "{h}"
        );
        let v = json(&params(TestKind::SendLat), &i, &[lat_result()]);
        assert_eq!(v["results"][0]["direct_path"], "direct session");
        assert_eq!(v["register_use"]["blueflame"], false);
        assert_eq!(v["register_use"]["reason"], "SharedRegister");
        i.direct_paths = vec![(8, "direct post_list")];
        i.register = Some(RegisterUse::BlueFlame { first_offset: 0 });
        let h = header(&params(TestKind::SendBw), &i);
        assert!(h.contains(" Direct path    : direct post_list\n"), "{h}");
        assert!(h.contains(" Register       : BlueFlame"), "{h}");
        let v = json(&params(TestKind::SendBw), &i, &[]);
        assert_eq!(v["register_use"]["blueflame"], true);
        assert_eq!(v["register_use"]["reason"], Value::Null);
        // Not a --direct run: neither.
        let h = header(&params(TestKind::SendLat), &info());
        assert!(!h.contains("Direct path") && !h.contains("Register"), "{h}");
        assert_eq!(
            json(&params(TestKind::SendLat), &info(), &[])["register_use"],
            Value::Null
        );
    }

    #[test]
    fn nic_clock_row_and_json() {
        let mut r = lat_result();
        r.nic_latency = Some(LatencySummary {
            min: 0.5,
            p50: 0.75,
            p90: 1.0,
            p99: 1.5,
            p999: 2.0,
            max: 2.5,
            avg: 0.8,
            stdev: 0.1,
        });
        let line = nic_row(&r).expect("a NIC row");
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f[..4], ["(NIC", "clock)", "0.50", "0.75"], "{line}");
        let mut i = info();
        i.nic_clock = Some("completion timestamps, 156.2 MHz".into());
        assert!(header(&params(TestKind::SendLat), &i).contains(" NIC clock      : completion"));
        let v = json(&params(TestKind::SendLat), &i, &[r]);
        assert_eq!(v["results"][0]["nic"]["t_p50_us"], 0.75);
        assert_eq!(v["post_path"], "ibv_wr_*");
    }

    #[test]
    fn bandwidth_row() {
        let r = SizeResult {
            bytes: 65536,
            iterations: 5000,
            latency: None,
            nic_latency: None,
            throughput: Throughput {
                seconds: 1.0,
                mib_per_s: 312.5,
                gbps: 2.62,
                mpps: 0.005,
            },
            per_qp: vec![5000],
        };
        assert!(header(&params(TestKind::WriteBw), &info()).contains("BW average[MiB/sec]"));
        let f: Vec<String> = row(TestKind::WriteBw, &r)
            .split_whitespace()
            .map(String::from)
            .collect();
        assert_eq!(f, ["65536", "5000", "312.50", "2.620", "0.005000"]);
        assert!(qp_row(&r).is_none(), "one QP: no per-QP row");
        let v = json(
            &params(TestKind::WriteBw),
            &info(),
            std::slice::from_ref(&r),
        );
        assert_eq!(v["results"][0]["per_qp_iterations"], json!([5000]));
        assert_eq!(v["results"][0]["qp_fairness"]["jain_index"], 1.0);
    }

    /// `-q`: the header counts the QPs, a row under each size shows how they shared it, and
    /// `--json` has each QP's count and the fairness figures.
    #[test]
    fn several_qps_show_their_shares() {
        let mut p = params(TestKind::SendBw);
        p.qps = 4;
        assert!(header(&p, &info()).contains(" Number of qps  : 4 "));
        let r = SizeResult {
            bytes: 64,
            iterations: 1000,
            latency: None,
            nic_latency: None,
            throughput: Throughput::new(64, 1000, std::time::Duration::from_millis(1)),
            per_qp: vec![200, 300, 250, 250],
        };
        let row = qp_row(&r).expect("a per-QP row");
        assert!(row.contains("(4 QPs)"), "{row}");
        assert!(row.contains("min 200 max 300 messages"), "{row}");
        assert!(row.contains("min/max 0.667"), "{row}");
        // (1000^2) / (4 * 255000) = 0.98039...
        assert!(row.contains("Jain's index 0.9804"), "{row}");
        let v = json(&p, &info(), &[r]);
        assert_eq!(v["params"]["qps"], 4);
        let got = &v["results"][0];
        assert_eq!(got["per_qp_iterations"], json!([200, 300, 250, 250]));
        let jain = got["qp_fairness"]["jain_index"].as_f64().unwrap();
        assert!((jain - 1e6 / 1.02e6).abs() < 1e-12, "{got}");
        assert_eq!(got["qp_fairness"]["min_over_max"], 200.0 / 300.0);
        // Latency results carry none of it.
        let v = json(&params(TestKind::SendLat), &info(), &[lat_result()]);
        assert!(v["results"][0].get("per_qp_iterations").is_none(), "{v}");
        assert!(v["results"][0].get("qp_fairness").is_none(), "{v}");
    }

    #[test]
    fn json_fields() {
        let v = json(&params(TestKind::SendLat), &info(), &[lat_result()]);
        assert_eq!(v["test"], "send_lat");
        assert_eq!(v["device"], "softnic");
        assert_eq!(v["role"], "loopback");
        assert_eq!(v["latency_is_half_round_trip"], true);
        let r = &v["results"][0];
        assert_eq!(r["bytes"], 2);
        assert_eq!(r["t_p999_us"], 4.0);
        assert_eq!(r["mpps"], 0.31);
        // Round-trips through text.
        let text = serde_json::to_string(&v).unwrap();
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, v);
    }
}
