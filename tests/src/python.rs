//! Python for the tests that drive clients nobody here wrote (the wire test's generated gRPC
//! client, reflection and health stubs; pyarrow and DuckDB reading a Parquet export; the
//! OpenTelemetry SDK exporting OTLP metrics): one virtual environment under the target
//! directory (`target/tmp/pyvenv`), one pinned requirements list for every Python test, made
//! once under a file lock (tests run in parallel processes) and reused after.
//!
//! A missing `python3` or `venv` module (the Debian package `python3-venv`, which
//! ./scripts/test.sh installs) or an unreachable PyPI fails the test with its reason, with or
//! without `CI=true`: there is no quiet skip.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The pinned requirements (versions verified together on the project machine; newer
/// releases may change APIs, e.g. DuckDB 2's `.arrow()`).
pub const REQUIREMENTS: [&str; 10] = [
    "grpcio==1.85.3",
    "grpcio-tools==1.85.1",
    "grpcio-reflection==1.85.1",
    "grpcio-health-checking==1.85.1",
    "protobuf==7.36.2",
    "pyarrow==26.0.1",
    "duckdb==2.0.1",
    "opentelemetry-api==1.45.2",
    "opentelemetry-sdk==1.45.2",
    "opentelemetry-exporter-otlp-proto-grpc==1.45.2",
];

/// `target/tmp` (what cargo calls CARGO_TARGET_TMPDIR; the kit is a library, so it finds it
/// from the test executable: target/<profile>/deps/<test>).
fn target_tmp() -> PathBuf {
    let bin = crate::gma_bin();
    let target = bin
        .parent()
        .and_then(Path::parent)
        .expect("the gma-e2e binary lives in target/<profile>/");
    target.join("tmp")
}

/// The Python of the shared virtual environment, made (or brought to [`REQUIREMENTS`]) when
/// needed.
pub fn python() -> PathBuf {
    let tmp = target_tmp();
    std::fs::create_dir_all(&tmp).unwrap();
    let venv = tmp.join("pyvenv");
    let py = venv.join("bin").join("python");
    let ready = venv.join(".gma-ready");
    let wanted = REQUIREMENTS.join("\n");
    let lock = std::fs::File::create(tmp.join("pyvenv.lock")).unwrap();
    lock.lock().unwrap();
    if py.is_file() && std::fs::read_to_string(&ready).is_ok_and(|r| r == wanted) {
        return py;
    }
    if !py.is_file() {
        let made = Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(&venv)
            .output();
        match made {
            Err(e) => panic!(
                "python3 is needed for the Python client tests and could not run ({e}): run \
                 ./scripts/test.sh (it installs python3-venv when missing) or apt-get install python3-venv"
            ),
            Ok(o) if !o.status.success() => panic!(
                "python3 -m venv failed (the venv module, Debian package python3-venv, is needed: run \
                 ./scripts/test.sh, which installs it, or apt-get install python3-venv): {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Ok(_) => {}
        }
    }
    let pip = Command::new(&py)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
        .args(REQUIREMENTS)
        .output()
        .unwrap();
    assert!(
        pip.status.success(),
        "pip install {} failed (is PyPI reachable?): {}",
        REQUIREMENTS.join(" "),
        String::from_utf8_lossy(&pip.stderr)
    );
    std::fs::write(&ready, wanted).unwrap();
    py
}

/// Writes `script` to `dir/name`, runs it with `py` and `args`; its stdout parsed as JSON (the
/// script prints one document). A failing script fails the test with its output.
pub fn run_py(py: &Path, dir: &Path, name: &str, script: &str, args: &[&str]) -> serde_json::Value {
    let path = dir.join(name);
    std::fs::write(&path, script).unwrap();
    let o = Command::new(py).arg(&path).args(args).output().unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{name} failed:\nstdout: {out}\nstderr: {err}");
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{name} printed no JSON ({e}): {out}\n{err}"))
}
