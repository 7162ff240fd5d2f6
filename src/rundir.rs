//! `/run/dbcage`: the state the daemon publishes for `status` and the metrics (the demand
//! split's shares, the replication guard's lag and actions), next to its control socket.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

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

/// A published file together with the daemon that maintains it.
#[derive(Serialize, Deserialize)]
struct Owned<T> {
    pid: u32,
    tenants: T,
}

/// `publish_json` of per-tenant state, stamped with this process's pid so that readers can
/// ignore what a killed daemon left behind (see `read_owned`).
pub fn publish_owned<T: Serialize>(path: &Path, tenants: &T) {
    publish_json(
        path,
        &Owned {
            pid: std::process::id(),
            tenants,
        },
    );
}

/// Reads what `publish_owned` wrote, if the daemon that wrote it still runs. A file left by a
/// daemon that was killed (its pid gone, or now another program) gives None.
pub fn read_owned<T: DeserializeOwned>(path: &Path) -> Option<T> {
    let text = std::fs::read_to_string(path).ok()?;
    let file: Owned<T> = serde_json::from_str(&text).ok()?;
    daemon_alive(file.pid).then_some(file.tenants)
}

fn daemon_alive(pid: u32) -> bool {
    let own = std::fs::read_link("/proc/self/exe").ok();
    let theirs = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    // The same binary, or at least a process called dbcage (after an upgrade the path differs).
    theirs.is_some() && (theirs == own || comm.trim_end() == "dbcage")
}
