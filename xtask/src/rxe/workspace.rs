//! The workspace: target directory, real-device test targets, their binaries.

use std::collections::BTreeSet;
use std::path::PathBuf;

use super::guest::Step;
use super::{capture, json, DEVICE, GID_INDEX, TEST_TIMEOUT};
use crate::util;

pub(super) struct Workspace {
    pub(super) target_dir: PathBuf,
    /// (package, target) of every integration test named `real_device*`.
    pub(super) real_device_targets: Vec<(String, String)>,
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
        real_device_targets: real_device_targets(&meta),
    })
}

/// The (package, target) pairs of integration tests named `real_device*`.
fn real_device_targets(meta: &json::Value) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for package in meta.get("packages").map_or(&[][..], json::Value::items) {
        let Some(pname) = package.get("name").and_then(json::Value::as_str) else {
            continue;
        };
        for target in package.get("targets").map_or(&[][..], json::Value::items) {
            if let Some(tname) = real_device_target(target) {
                found.push((pname.to_string(), tname.to_string()));
            }
        }
    }
    found.sort();
    found
}

/// The name of `target` (cargo's JSON for a build target) if it is a real-device test.
fn real_device_target(target: &json::Value) -> Option<&str> {
    let is_test = target
        .get("kind")
        .map_or(&[][..], json::Value::items)
        .iter()
        .any(|k| k.as_str() == Some("test"));
    let name = target.get("name")?.as_str()?;
    (is_test && name.starts_with("real_device")).then_some(name)
}

/// A built real-device test binary.
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

/// Builds the real-device test targets (only those: an unrelated crate's tests need not
/// build for this suite) and returns their executables.
pub(super) fn build_real_device_tests(
    targets: &[(String, String)],
) -> Result<Vec<TestBinary>, String> {
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
        found.extend(real_device_executable(&msg));
    }
    found.sort_by(|a, b| (&a.package, &a.target).cmp(&(&b.package, &b.target)));
    found.dedup_by(|a, b| a.path == b.path);
    Ok(found)
}

/// The test binary a `compiler-artifact` message of `cargo --message-format=json` names,
/// if it is a real-device test.
fn real_device_executable(msg: &json::Value) -> Option<TestBinary> {
    if msg.get("reason")?.as_str()? != "compiler-artifact" {
        return None;
    }
    let target = real_device_target(msg.get("target")?)?;
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
    fn cargo_json_finds_real_device_tests() {
        let line = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/verbs#hotverbs@0.1.0","manifest_path":"/w/verbs/Cargo.toml","target":{"kind":["test"],"crate_types":["bin"],"name":"real_device","src_path":"/w/verbs/tests/real_device.rs","edition":"2021","doc":false,"doctest":false,"test":true},"profile":{"opt_level":"0","debug_assertions":true,"test":true},"features":[],"filenames":["/w/target/debug/deps/real_device-0123abcd"],"executable":"/w/target/debug/deps/real_device-0123abcd","fresh":false}"#;
        let msg = json::parse(line).unwrap();
        assert_eq!(
            real_device_executable(&msg),
            Some(TestBinary {
                package: "hotverbs".into(),
                target: "real_device".into(),
                path: "/w/target/debug/deps/real_device-0123abcd".into(),
            })
        );
        let lib = line.replace(r#""kind":["test"]"#, r#""kind":["lib"]"#);
        assert_eq!(real_device_executable(&json::parse(&lib).unwrap()), None);
        let other = line.replace(r#""name":"real_device""#, r#""name":"softnic""#);
        assert_eq!(real_device_executable(&json::parse(&other).unwrap()), None);

        let meta = json::parse(
            r#"{"packages":[{"name":"hotverbs","targets":[{"kind":["lib"],"name":"hotverbs"},{"kind":["test"],"name":"real_device_qp"}]},
                {"name":"hotverbs-ffi","targets":[{"kind":["test"],"name":"layout"}]}],
               "target_directory":"/w/target","esc":"a\"b\\c\u00e9\ud83d\ude00","n":[1,-2.5e3,true,null]}"#,
        )
        .unwrap();
        assert_eq!(
            real_device_targets(&meta),
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
