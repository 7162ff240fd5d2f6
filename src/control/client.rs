//! The client side of the control socket (`dbcage set`, `reload`, and `status` for overrides).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use super::protocol::{Request, Response};

/// Why a request did not get an answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing listens there: the daemon is not running (or runs with another `agent.root`).
    #[error("no dbcage daemon is listening on {path}: start it with `systemctl start dbcage` (or `dbcage run`), or apply this once without it with `--direct`")]
    NoDaemon { path: String },
    #[error("permission denied on {path}: only root and members of the policy's agent.control_group may use the control socket")]
    Denied { path: String },
    /// The io error as text: a broken pipe here is a failure, not a closed stdout.
    #[error("talking to the daemon on {path}: {reason}")]
    Io { path: String, reason: String },
    #[error("the daemon's answer on {path} is not understood: {reason}")]
    BadReply { path: String, reason: String },
}

/// Sends one request and reads the answer.
pub fn send(path: &Path, request: &Request) -> Result<Response, ClientError> {
    let shown = path.display().to_string();
    let io = |e: std::io::Error| ClientError::Io {
        path: shown.clone(),
        reason: e.to_string(),
    };
    let mut stream = UnixStream::connect(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            ClientError::NoDaemon {
                path: shown.clone(),
            }
        }
        std::io::ErrorKind::PermissionDenied => ClientError::Denied {
            path: shown.clone(),
        },
        _ => io(e),
    })?;
    stream
        .set_read_timeout(Some(Duration::from_secs(90)))
        .map_err(io)?;
    // A daemon that refuses before reading (busy, not authorized) has answered and closed:
    // its answer is still there to read after a failed write.
    let written = stream.write_all(&request.line());
    let mut line = Vec::new();
    let read = BufReader::new((&stream).take(1 << 20)).read_until(b'\n', &mut line);
    if line.is_empty() {
        written.map_err(io)?;
        read.map_err(io)?;
    }
    serde_json::from_slice(&line).map_err(|e| ClientError::BadReply {
        path: shown.clone(),
        reason: if line.is_empty() {
            "the connection closed without an answer".into()
        } else {
            e.to_string()
        },
    })
}
