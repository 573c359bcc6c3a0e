//! The workspace: target directory, the device test targets (integration tests named
//! `real_device*` or `fault_scenarios`), their binaries.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::guest::Step;
use super::{capture, json, DEVICE, GID_INDEX, TEST_TIMEOUT};
use crate::util;

pub(super) struct Workspace {
    pub(super) target_dir: PathBuf,
    /// (package, target) of every device test (see [`is_device_test`]).
    pub(super) device_test_targets: Vec<(String, String)>,
}

pub(super) fn workspace() -> Result<Workspace, String> {
    let mut cmd = util::cargo();
    cmd.args(["metadata", "--no-deps", "--format-version", "1"]);
    let text = capture(&mut cmd)?;
    let meta = json::parse(&text).map_err(|e| format!("cargo metadata: {e}"))?;
    let target_dir = meta
        .get("target_directory")
        .and_then(json::Value::as_str)
        .ok_or("cargo metadata: no target_directory")?
        .into();
    Ok(Workspace {
        target_dir,
        device_test_targets: device_test_targets(&meta),
    })
}

/// Whether an integration-test target of this name runs in the VM: `real_device*`
/// (convention: `tests/real_device.rs`) and `fault_scenarios` (`tests/fault_scenarios.rs`,
/// the failure scenarios of `rxe_faults.c` replayed through hotverbs). Both probe for a device
/// through `HOTVERBS_DEVICE` and fail without one under `HOTVERBS_RXE=1`.
fn is_device_test(name: &str) -> bool {
    name.starts_with("real_device") || name == "fault_scenarios"
}

/// The (package, target) pairs of the device tests.
fn device_test_targets(meta: &json::Value) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for package in meta.get("packages").map_or(&[][..], json::Value::items) {
        let Some(pname) = package.get("name").and_then(json::Value::as_str) else {
            continue;
        };
        for target in package.get("targets").map_or(&[][..], json::Value::items) {
            if let Some(tname) = device_test_target(target) {
                found.push((pname.to_string(), tname.to_string()));
            }
        }
    }
    found.sort();
    found
}

/// The name of `target` (cargo's JSON for a build target) if it is a device test.
fn device_test_target(target: &json::Value) -> Option<&str> {
    let is_test = target
        .get("kind")
        .map_or(&[][..], json::Value::items)
        .iter()
        .any(|k| k.as_str() == Some("test"));
    let name = target.get("name")?.as_str()?;
    (is_test && is_device_test(name)).then_some(name)
}

/// A built device test binary.
#[derive(Debug, PartialEq)]
pub(super) struct TestBinary {
    pub(super) package: String,
    pub(super) target: String,
    pub(super) path: PathBuf,
}

impl TestBinary {
    pub(super) fn step(&self, guest: String, filter: Option<&str>) -> Step {
        let mut cmd = vec![guest, "--test-threads=1".to_string()];
        cmd.extend(filter.map(str::to_string));
        Step {
            env: vec![
                ("HOTVERBS_RXE".into(), "1".into()),
                ("HOTVERBS_DEVICE".into(), DEVICE.into()),
                ("HOTVERBS_GID_INDEX".into(), GID_INDEX.into()),
                ("RUST_BACKTRACE".into(), "1".into()),
                ("LD_LIBRARY_PATH".into(), "/host/lib".into()),
            ],
            timeout: TEST_TIMEOUT,
            tests: true,
            ..Step::program(&format!("test {}/{}", self.package, self.target), cmd)
        }
    }
}

/// Builds the device test targets (only those: an unrelated crate's tests need not build
/// for this suite) and returns their executables.
pub(super) fn build_device_tests(targets: &[(String, String)]) -> Result<Vec<TestBinary>, String> {
    if targets.is_empty() {
        return Ok(Vec::new());
    }
    let mut cmd = util::cargo();
    cmd.args([
        "test",
        "--workspace",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]);
    let names: BTreeSet<&str> = targets.iter().map(|(_, t)| t.as_str()).collect();
    for name in names {
        cmd.args(["--test", name]);
    }
    let text = capture(&mut cmd)?;
    let mut found = Vec::new();
    for line in text.lines().filter(|l| l.starts_with('{')) {
        let msg = json::parse(line).map_err(|e| format!("cargo's JSON: {e}: {line}"))?;
        found.extend(device_test_executable(&msg));
    }
    found.sort_by(|a, b| (&a.package, &a.target).cmp(&(&b.package, &b.target)));
    found.dedup_by(|a, b| a.path == b.path);
    Ok(found)
}

/// Every test executable of `packages` that `cargo test --workspace` builds (the
/// workspace's own feature set, so nothing is rebuilt after a `cargo test --workspace`):
/// package, its directory (where `cargo test` runs it) and path.
pub(crate) fn workspace_test_executables(
    packages: &[&str],
) -> Result<Vec<(String, PathBuf, PathBuf)>, String> {
    let mut cmd = util::cargo();
    cmd.args([
        "test",
        "--workspace",
        "--locked",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]);
    let text = capture(&mut cmd)?;
    let mut found = Vec::new();
    for line in text.lines().filter(|l| l.starts_with('{')) {
        let msg = json::parse(line).map_err(|e| format!("cargo's JSON: {e}: {line}"))?;
        if msg.get("reason").and_then(json::Value::as_str) != Some("compiler-artifact")
            || msg.get("profile").and_then(|p| p.get("test")) != Some(&json::Value::Bool(true))
        {
            continue;
        }
        let (Some(id), Some(manifest), Some(exe)) = (
            msg.get("package_id").and_then(json::Value::as_str),
            msg.get("manifest_path").and_then(json::Value::as_str),
            msg.get("executable").and_then(json::Value::as_str),
        ) else {
            continue;
        };
        let package = package_name(id);
        if packages.contains(&package.as_str()) {
            let dir = Path::new(manifest)
                .parent()
                .unwrap_or(Path::new("."))
                .into();
            found.push((package, dir, exe.into()));
        }
    }
    found.sort();
    found.dedup();
    if found.is_empty() {
        return Err(format!(
            "no test executables of {packages:?} in `cargo test --workspace`"
        ));
    }
    Ok(found)
}

/// The test binary a `compiler-artifact` message of `cargo --message-format=json` names,
/// if it is a device test.
fn device_test_executable(msg: &json::Value) -> Option<TestBinary> {
    if msg.get("reason")?.as_str()? != "compiler-artifact" {
        return None;
    }
    let target = device_test_target(msg.get("target")?)?;
    Some(TestBinary {
        package: package_name(msg.get("package_id")?.as_str()?),
        target: target.to_string(),
        path: msg.get("executable")?.as_str()?.into(),
    })
}

/// The package name in a cargo package id, old (`name 0.1.0 (path+file://...)`) or new
/// (`path+file:///dir#name@0.1.0`, or `path+file:///dir/name#0.1.0` when the name is the
/// folder's).
fn package_name(id: &str) -> String {
    match id.split_once('#') {
        Some((url, fragment)) => match fragment.split_once('@') {
            Some((name, _)) => name.to_string(),
            None => url.rsplit('/').next().unwrap_or(url).to_string(),
        },
        None => id.split_whitespace().next().unwrap_or(id).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cargo_json_finds_device_tests() {
        let line = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/verbs#hotverbs@0.1.0","manifest_path":"/w/verbs/Cargo.toml","target":{"kind":["test"],"crate_types":["bin"],"name":"real_device","src_path":"/w/verbs/tests/real_device.rs","edition":"2021","doc":false,"doctest":false,"test":true},"profile":{"opt_level":"0","debug_assertions":true,"test":true},"features":[],"filenames":["/w/target/debug/deps/real_device-0123abcd"],"executable":"/w/target/debug/deps/real_device-0123abcd","fresh":false}"#;
        let msg = json::parse(line).unwrap();
        assert_eq!(
            device_test_executable(&msg),
            Some(TestBinary {
                package: "hotverbs".into(),
                target: "real_device".into(),
                path: "/w/target/debug/deps/real_device-0123abcd".into(),
            })
        );
        let lib = line.replace(r#""kind":["test"]"#, r#""kind":["lib"]"#);
        assert_eq!(device_test_executable(&json::parse(&lib).unwrap()), None);
        let other = line.replace(r#""name":"real_device""#, r#""name":"softnic""#);
        assert_eq!(device_test_executable(&json::parse(&other).unwrap()), None);
        let faults = line
            .replace(r#""name":"real_device""#, r#""name":"fault_scenarios""#)
            .replace("/real_device", "/fault_scenarios");
        assert_eq!(
            device_test_executable(&json::parse(&faults).unwrap()),
            Some(TestBinary {
                package: "hotverbs".into(),
                target: "fault_scenarios".into(),
                path: "/w/target/debug/deps/fault_scenarios-0123abcd".into(),
            })
        );
        // A library, a binary or an example of that name is not a device test.
        let faults_bin = faults.replace(r#""kind":["test"]"#, r#""kind":["bin"]"#);
        assert_eq!(
            device_test_executable(&json::parse(&faults_bin).unwrap()),
            None
        );

        let meta = json::parse(
            r#"{"packages":[{"name":"hotverbs","targets":[{"kind":["lib"],"name":"hotverbs"},{"kind":["test"],"name":"real_device_qp"}]},
                {"name":"hotverbs-ffi","targets":[{"kind":["test"],"name":"layout"}]}],
               "target_directory":"/w/target","esc":"a\"b\\c\u00e9\ud83d\ude00","n":[1,-2.5e3,true,null]}"#,
        )
        .unwrap();
        assert_eq!(
            device_test_targets(&meta),
            [("hotverbs".to_string(), "real_device_qp".to_string())]
        );
        assert_eq!(
            meta.get("esc").and_then(json::Value::as_str),
            Some("a\"b\\cé😀")
        );
        assert_eq!(
            meta.get("n").unwrap().items(),
            [
                json::Value::Number(1.0),
                json::Value::Number(-2500.0),
                json::Value::Bool(true),
                json::Value::Null
            ]
        );
        assert!(json::parse(r#"{"a":1"#).is_err());
        assert!(json::parse(r#"{"a":1} x"#).is_err());
    }

    #[test]
    fn metadata_finds_fault_scenarios_beside_real_device_tests() {
        // `cargo metadata --no-deps --format-version 1`, trimmed, once verbs/tests/
        // fault_scenarios.rs exists: its target sits next to the real-device ones.
        let meta = json::parse(
            r#"{"packages":[
                {"name":"hotverbs","id":"path+file:///w/verbs#hotverbs@0.1.0","targets":[
                    {"kind":["lib"],"crate_types":["lib"],"name":"hotverbs","src_path":"/w/verbs/src/lib.rs","test":true},
                    {"kind":["test"],"crate_types":["bin"],"name":"real_device","src_path":"/w/verbs/tests/real_device.rs","test":true},
                    {"kind":["test"],"crate_types":["bin"],"name":"fault_scenarios","src_path":"/w/verbs/tests/fault_scenarios.rs","test":true},
                    {"kind":["test"],"crate_types":["bin"],"name":"fault_scenarios_extra","src_path":"/w/verbs/tests/fault_scenarios_extra.rs","test":true},
                    {"kind":["example"],"crate_types":["bin"],"name":"fault_scenarios","src_path":"/w/verbs/examples/fault_scenarios.rs","test":false}]},
                {"name":"hotverbs-datapath","id":"path+file:///w/datapath#hotverbs-datapath@0.1.0","targets":[
                    {"kind":["test"],"crate_types":["bin"],"name":"real_device","src_path":"/w/datapath/tests/real_device.rs","test":true},
                    {"kind":["test"],"crate_types":["bin"],"name":"softnic","src_path":"/w/datapath/tests/softnic.rs","test":true}]},
                {"name":"hotverbs-softnic","targets":[
                    {"kind":["test"],"crate_types":["bin"],"name":"failures","src_path":"/w/softnic/tests/failures.rs","test":true}]}],
               "workspace_members":[],"target_directory":"/w/target","version":1}"#,
        )
        .unwrap();
        assert_eq!(
            device_test_targets(&meta),
            [
                ("hotverbs".to_string(), "fault_scenarios".to_string()),
                ("hotverbs".to_string(), "real_device".to_string()),
                ("hotverbs-datapath".to_string(), "real_device".to_string()),
            ]
        );
        // Before the file exists: only the real-device tests.
        let without = json::parse(
            r#"{"packages":[{"name":"hotverbs","targets":[
                    {"kind":["lib"],"name":"hotverbs"},
                    {"kind":["test"],"name":"real_device"}]}]}"#,
        )
        .unwrap();
        assert_eq!(
            device_test_targets(&without),
            [("hotverbs".to_string(), "real_device".to_string())]
        );
        assert!(is_device_test("real_device_cm"));
        assert!(!is_device_test("fault_scenario"));
        assert!(!is_device_test("my_real_device"));
    }

    #[test]
    fn package_names_from_ids() {
        assert_eq!(
            package_name("path+file:///w/verbs#hotverbs@0.1.0"),
            "hotverbs"
        );
        assert_eq!(package_name("path+file:///w/xtask#0.1.0"), "xtask");
        assert_eq!(
            package_name("hotverbs-ffi 0.1.0 (path+file:///w/verbs-ffi)"),
            "hotverbs-ffi"
        );
    }
}
