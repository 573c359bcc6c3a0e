//! The README's quick start runs as written (on softnic here; on the device named by
//! HOTVERBS_DEVICE when set).

#[allow(dead_code)]
#[path = "../examples/quickstart.rs"]
mod quickstart;

#[test]
fn readme_quickstart_runs() {
    // main() asserts that the last WRITE landed in the target MR.
    quickstart::main().expect("quickstart failed");
}
