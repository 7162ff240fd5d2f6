//! The daemon's control socket: a Unix stream socket at `/run/dbcage/<root>.sock`.
//!
//! Who may connect is decided twice: by the file system (the socket is root's, mode 0600, or
//! 0660 with the group `agent.control_group`; the directory is root's, 0711, so it cannot be
//! listed or written) and by the kernel's word on the peer (SO_PEERCRED): uid 0, or a user whose
//! primary or supplementary groups include the control group. Anyone else gets a refusal that
//! says so.
//!
//! A listener thread accepts; each connection gets a short-lived thread (at most
//! `MAX_CONNECTIONS` at once) that checks the peer, reads one bounded line with a timeout,
//! parses it, and hands the request to the daemon's loop through a channel, waking the loop
//! through a socket pair that sits in its poll set. The loop applies (one thread changes the
//! kernel, as for every other event) and sends the reply back. A slow or hostile client holds
//! only its own thread, for at most the read timeout.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tracing::{info, warn};

use super::protocol::{parse_request, Request, Response, MAX_REQUEST};
use crate::policy::ControlGroup;

/// Connections served at once; more are refused with "busy".
pub const MAX_CONNECTIONS: usize = 16;
/// How long a client may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a client waits for the daemon's answer before it is told the daemon is busy.
const REPLY_TIMEOUT: Duration = Duration::from_secs(60);
const NO_GROUP: u32 = u32::MAX;

/// A request waiting for the daemon's loop.
pub struct Pending {
    pub request: Request,
    /// When its line was read (the start of the `set → limit in kernel` latency).
    pub received: Instant,
    /// Who sent it, for the log.
    pub peer: String,
    reply: mpsc::SyncSender<Response>,
}

impl Pending {
    pub fn reply(self, r: Response) {
        let _ = self.reply.send(r); // the client may have gone; nothing to do then
    }
}

pub struct Server {
    path: PathBuf,
    wake: UnixStream,
    requests: mpsc::Receiver<Pending>,
    group: Arc<AtomicU32>,
    group_name: Arc<std::sync::Mutex<String>>,
}

/// Whether the peer may change limits: root, or a member of the control group.
pub fn authorized(uid: u32, gid: u32, group: Option<u32>) -> bool {
    if uid == 0 {
        return true;
    }
    let Some(want) = group else {
        return false;
    };
    if gid == want {
        return true;
    }
    let Ok(Some(user)) = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) else {
        return false;
    };
    if user.gid.as_raw() == want {
        return true;
    }
    let Ok(name) = std::ffi::CString::new(user.name) else {
        return false;
    };
    nix::unistd::getgrouplist(&name, user.gid)
        .map(|groups| groups.iter().any(|g| g.as_raw() == want))
        .unwrap_or(false)
}

/// Creates `/run/dbcage` (root, 0711) if needed and refuses one that someone else controls.
fn prepare_dir(dir: &Path, group: bool) -> Result<()> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .mode(0o711)
            .recursive(true)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
            .with_context(|| format!("chmod 0711 {}", dir.display()))?;
    }
    let md = std::fs::symlink_metadata(dir).with_context(|| format!("{}", dir.display()))?;
    if !md.is_dir() || md.uid() != 0 || md.mode() & 0o022 != 0 {
        bail!(
            "{} must be a directory owned by root and not writable by group or others (it is {}, uid {}, mode {:04o})",
            dir.display(),
            if md.is_dir() { "a directory" } else { "not a directory" },
            md.uid(),
            md.mode() & 0o7777
        );
    }
    // Members of the control group must reach the socket: search permission, no listing.
    if group && md.mode() & 0o011 != 0o011 {
        std::fs::set_permissions(
            dir,
            std::fs::Permissions::from_mode((md.mode() & 0o7777) | 0o011),
        )
        .with_context(|| format!("chmod a+x {}", dir.display()))?;
    }
    Ok(())
}

/// Mode and group of the socket file for a control group.
fn set_access(path: &Path, group: Option<&ControlGroup>) -> Result<()> {
    let gid = group.map(|g| nix::unistd::Gid::from_raw(g.gid));
    nix::unistd::chown(path, Some(nix::unistd::Uid::from_raw(0)), gid)
        .with_context(|| format!("chown {}", path.display()))?;
    let mode = if group.is_some() { 0o660 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {mode:o} {}", path.display()))
}

impl Server {
    /// Binds the socket at `path` and starts accepting. A socket file left by a daemon that is
    /// gone is replaced; one that a running daemon answers on is an error.
    pub fn start(path: &Path, group: Option<&ControlGroup>) -> Result<Server> {
        let dir = path.parent().context("the socket has a directory")?;
        prepare_dir(dir, group.is_some())?;
        if std::fs::symlink_metadata(path).is_ok() {
            if UnixStream::connect(path).is_ok() {
                bail!(
                    "another dbcage daemon is serving {} (the same agent.root); stop it first",
                    path.display()
                );
            }
            std::fs::remove_file(path)
                .with_context(|| format!("removing the stale socket {}", path.display()))?;
        }
        let listener =
            UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
        set_access(path, group)?;
        let (wake, wake_tx) = UnixStream::pair().context("socketpair")?;
        wake.set_nonblocking(true)?;
        wake_tx.set_nonblocking(true)?;
        let (tx, requests) = mpsc::channel();
        let gid = Arc::new(AtomicU32::new(group.map_or(NO_GROUP, |g| g.gid)));
        let group_name = Arc::new(std::sync::Mutex::new(
            group.map(|g| g.name.clone()).unwrap_or_default(),
        ));
        let (gid2, name2) = (gid.clone(), group_name.clone());
        let wake_tx = Arc::new(wake_tx);
        std::thread::Builder::new()
            .name("dbcage-control".into())
            .spawn(move || accept_loop(listener, tx, wake_tx, gid2, name2))
            .context("starting the control thread")?;
        Ok(Server {
            path: path.to_path_buf(),
            wake,
            requests,
            group: gid,
            group_name,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The fd the daemon polls: readable when requests are waiting.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.wake.as_fd()
    }

    /// The requests waiting now.
    pub fn take(&self) -> Vec<Pending> {
        let mut buf = [0u8; 256];
        while matches!((&self.wake).read(&mut buf), Ok(n) if n > 0) {}
        self.requests.try_iter().collect()
    }

    /// Follows a changed `agent.control_group` (after a reload).
    pub fn set_group(&self, group: Option<&ControlGroup>) {
        let gid = group.map_or(NO_GROUP, |g| g.gid);
        if self.group.swap(gid, Ordering::SeqCst) != gid {
            *self.group_name.lock().unwrap_or_else(|e| e.into_inner()) =
                group.map(|g| g.name.clone()).unwrap_or_default();
            let dir = self.path.parent().unwrap_or(Path::new(super::SOCKET_DIR));
            if let Err(e) =
                prepare_dir(dir, group.is_some()).and_then(|()| set_access(&self.path, group))
            {
                warn!("control socket: {e:#}");
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn accept_loop(
    listener: UnixListener,
    tx: mpsc::Sender<Pending>,
    wake: Arc<UnixStream>,
    group: Arc<AtomicU32>,
    group_name: Arc<std::sync::Mutex<String>>,
) {
    let active = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let mut stream = match conn {
            Ok(s) => s,
            Err(e) => {
                warn!("control socket: accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::SeqCst);
            let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
            let _ = stream.write_all(
                &Response::refuse("the daemon is busy with other control requests; try again")
                    .line(),
            );
            continue;
        }
        let (tx, wake, active) = (tx.clone(), wake.clone(), active.clone());
        let want = group.load(Ordering::SeqCst);
        let name = group_name.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let spawned = std::thread::Builder::new()
            .name("dbcage-control-conn".into())
            .spawn(move || {
                serve(stream, &tx, &wake, want, &name);
                active.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            warn!("control socket: cannot start a thread for a connection: {e}");
        }
    }
}

fn serve(
    stream: UnixStream,
    tx: &mpsc::Sender<Pending>,
    wake: &UnixStream,
    group: u32,
    group_name: &str,
) {
    let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
    let _ = stream.set_write_timeout(Some(READ_TIMEOUT));
    let answer = |r: Response| {
        let _ = (&stream).write_all(&r.line());
    };
    let cred =
        match nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials) {
            Ok(c) => c,
            Err(e) => {
                return answer(Response::refuse(format!(
                    "cannot read the peer's credentials: {e}"
                )))
            }
        };
    let (uid, gid, pid) = (cred.uid(), cred.gid(), cred.pid());
    let peer = format!("uid {uid} pid {pid}");
    let group = (group != NO_GROUP).then_some(group);
    if !authorized(uid, gid, group) {
        warn!(
            uid,
            pid, "control socket: refused a client that is neither root nor in the control group"
        );
        return answer(Response::refuse(match group {
            Some(_) => format!(
                "permission denied: uid {uid} is neither root nor a member of the control group `{group_name}` (agent.control_group)"
            ),
            None => format!(
                "permission denied: uid {uid} is not root, and the policy names no agent.control_group"
            ),
        }));
    }
    let mut line = Vec::new();
    let read = BufReader::new((&stream).take(MAX_REQUEST as u64 + 1)).read_until(b'\n', &mut line);
    if let Err(e) = read {
        return answer(Response::refuse(format!("reading the request: {e}")));
    }
    let request = match parse_request(&line) {
        Ok(r) => r,
        Err(e) => return answer(Response::refuse(e)),
    };
    let received = Instant::now();
    if request.op.is_query() {
        tracing::debug!(%peer, op = %request.op, "control request");
    } else {
        info!(%peer, op = %request.op, "control request");
    }
    let (reply, replies) = mpsc::sync_channel(1);
    if tx
        .send(Pending {
            request,
            received,
            peer,
            reply,
        })
        .is_err()
    {
        return answer(Response::refuse("the daemon is stopping"));
    }
    let _ = (&*wake).write(&[1]);
    match replies.recv_timeout(REPLY_TIMEOUT) {
        Ok(r) => answer(r),
        Err(_) => answer(Response::refuse(
            "the daemon did not answer in time; the change may still be applied (see `dbcage status`)",
        )),
    }
}
