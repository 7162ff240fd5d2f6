//! `/run/dbcage`: the state the daemon publishes for `status` and the metrics (the demand
//! split's shares, the replication guard's lag and actions), next to its control socket.

use std::path::{Path, PathBuf};

use serde::Serialize;

pub const RUN_DIR: &str = "/run/dbcage";

/// `/run/dbcage/<root>.<what>.json`.
pub fn state_path(root_name: &str, what: &str) -> PathBuf {
    Path::new(RUN_DIR).join(format!("{root_name}.{what}.json"))
}

/// Writes `value` as JSON to `path` so that a reader never sees half a file (a temporary file,
/// then rename), creating the directory (0700) if it is missing. Failures are ignored: the
/// published state only informs `status`; the limits themselves are in the kernel.
pub fn publish_json<T: Serialize>(path: &Path, value: &T) {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(dir) = path.parent() {
        let _ = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir);
    }
    let tmp = path.with_extension("json.tmp");
    if let Ok(text) = serde_json::to_string(value) {
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, path);
        }
    }
}
