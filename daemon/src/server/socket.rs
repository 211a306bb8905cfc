//! The listening socket: path and permissions, stale-socket recovery, systemd activation.
//!
//! Permissions: the daemon sets the mode only of a directory it creates (0700). An existing
//! directory is used as it is, never chmod-ed (`--socket ./engine.sock` once locked the user's
//! current folder, and as root `--socket /tmp/x.sock` would have locked /tmp), and refused when
//! other users can enter it, unless `[daemon] shared_socket_dir = true`. The socket file is 0600
//! either way.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::io::FromRawFd;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("another kazeia daemon is already serving on {0}; stop it first (kazeia status --socket {0})")]
    InUse(String),
    #[error("{0} exists and is not a socket: refusing to replace it")]
    NotASocket(String),
    #[error("cannot prepare the socket directory {path}: {source}")]
    Dir { path: String, source: io::Error },
    #[error(
        "the socket directory {path} is open to other users (mode {mode:04o}): use a private directory \
         (e.g. the default, $XDG_RUNTIME_DIR/kazeia), or set [daemon] shared_socket_dir = true"
    )]
    SharedDir { path: String, mode: u32 },
    #[error("cannot bind {path}: {source}")]
    Bind { path: String, source: io::Error },
    #[error("systemd socket activation: {0}")]
    Activation(String),
}

/// The default socket: `$XDG_RUNTIME_DIR/kazeia/engine.sock`, else under the cache directory.
pub fn default_path() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir).join("kazeia").join("engine.sock"),
        _ => dirs::cache_dir().unwrap_or_else(std::env::temp_dir).join("kazeia").join("run").join("engine.sock"),
    }
}

/// Where the listener came from: a file we own (removed at exit) or one systemd handed us.
pub enum Bound {
    /// `file`: the socket file bound (device, inode), to remove it only if it is still ours.
    Owned {
        listener: UnixListener,
        path: PathBuf,
        file: Option<(u64, u64)>,
    },
    Activated {
        listener: UnixListener,
    },
}

/// Remove the socket file at `path` if it is still the one this daemon bound (`file`) and no
/// one listens there (this daemon's listener is closed by then). A daemon started while this
/// one drained its last turns finds the listener gone (`ECONNREFUSED`), takes the path and
/// binds its own socket there: removing the path at the end of the shutdown removed that one,
/// and the new daemon served no one. (The inode alone does not tell: ext4 gives a new file the
/// number its predecessor freed.)
pub fn remove_own(path: &Path, file: Option<(u64, u64)>) {
    let now = identity(path);
    if now.is_some() && now == file && StdUnixStream::connect(path).is_err() {
        let _ = std::fs::remove_file(path);
    } else if now.is_some() {
        tracing::info!(path = %path.display(), "the socket path holds another daemon's socket now: left in place");
    }
}

/// The file at `path` (not followed): device and inode.
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

impl Bound {
    pub fn listener(&self) -> &UnixListener {
        match self {
            Bound::Owned { listener, .. } | Bound::Activated { listener } => listener,
        }
    }
}

/// A socket created by Android's init (`socket kazeia stream 0660 …` in the service's .rc):
/// its fd is in `ANDROID_SOCKET_kazeia`, already bound and listening.
fn android_socket() -> Result<Option<UnixListener>, SocketError> {
    let Ok(fd) = std::env::var("ANDROID_SOCKET_kazeia") else { return Ok(None) };
    let fd: i32 = fd.trim().parse().map_err(|_| SocketError::Activation(format!("ANDROID_SOCKET_kazeia={fd:?}")))?;
    std::env::remove_var("ANDROID_SOCKET_kazeia");
    // SAFETY: init hands this listening socket to this process; nobody else owns the fd.
    let std_listener = unsafe { std::os::unix::net::UnixListener::from_raw_fd(fd) };
    std_listener.set_nonblocking(true).map_err(|e| SocketError::Activation(e.to_string()))?;
    UnixListener::from_std(std_listener).map(Some).map_err(|e| SocketError::Activation(e.to_string()))
}

/// A socket passed by systemd (`LISTEN_PID` = us, `LISTEN_FDS` >= 1): fd 3; or by Android's
/// init (see [`android_socket`]).
fn activated() -> Result<Option<UnixListener>, SocketError> {
    if let Some(l) = android_socket()? {
        return Ok(Some(l));
    }
    let (Ok(pid), Ok(fds)) = (std::env::var("LISTEN_PID"), std::env::var("LISTEN_FDS")) else {
        return Ok(None);
    };
    if pid.trim().parse::<u32>().ok() != Some(std::process::id()) {
        return Ok(None);
    }
    let n: i32 = fds.trim().parse().map_err(|_| SocketError::Activation(format!("LISTEN_FDS={fds:?}")))?;
    if n < 1 {
        return Ok(None);
    }
    // Not for our children.
    std::env::remove_var("LISTEN_PID");
    std::env::remove_var("LISTEN_FDS");
    std::env::remove_var("LISTEN_FDNAMES");
    // SAFETY: systemd passes the listening sockets starting at fd 3, owned by this process.
    let std_listener = unsafe { std::os::unix::net::UnixListener::from_raw_fd(3) };
    std_listener.set_nonblocking(true).map_err(|e| SocketError::Activation(e.to_string()))?;
    UnixListener::from_std(std_listener).map(Some).map_err(|e| SocketError::Activation(e.to_string()))
}

/// The socket's directory: created 0700 when missing (only the owner may even reach the
/// socket); an existing one is left as it is, and refused when group or others may enter it
/// unless `shared` says that is wanted.
fn prepare_dir(dir: &Path, shared: bool) -> Result<(), SocketError> {
    let err = |source| SocketError::Dir { path: dir.display().to_string(), source };
    match std::fs::metadata(dir) {
        Ok(meta) if !meta.is_dir() => Err(err(io::Error::new(io::ErrorKind::NotADirectory, "not a directory"))),
        Ok(meta) => {
            let mode = meta.permissions().mode() & 0o7777;
            if mode & 0o011 != 0 && !shared {
                return Err(SocketError::SharedDir { path: dir.display().to_string(), mode });
            }
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(err)
        }
        Err(e) => Err(err(e)),
    }
}

/// Bind the daemon's socket. A socket file left by a killed daemon is replaced; a live daemon's
/// socket is never taken. `shared_dir`: `[daemon] shared_socket_dir`.
pub fn bind(path: &Path, shared_dir: bool) -> Result<Bound, SocketError> {
    if let Some(listener) = activated()? {
        return Ok(Bound::Activated { listener });
    }
    let show = path.display().to_string();
    // `engine.sock` alone: the current directory.
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    prepare_dir(dir, shared_dir)?;
    match std::fs::symlink_metadata(path) {
        Ok(meta) => {
            use std::os::unix::fs::FileTypeExt;
            if !meta.file_type().is_socket() {
                return Err(SocketError::NotASocket(show));
            }
            match StdUnixStream::connect(path) {
                Ok(_) => return Err(SocketError::InUse(show)),
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    tracing::warn!(path = %show, "removing a stale socket left by a daemon that is gone");
                    std::fs::remove_file(path).map_err(|source| SocketError::Bind { path: show.clone(), source })?;
                }
                Err(source) => return Err(SocketError::Bind { path: show, source }),
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => return Err(SocketError::Bind { path: show, source }),
    }
    let listener = UnixListener::bind(path).map_err(|source| SocketError::Bind { path: show.clone(), source })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|source| SocketError::Bind { path: show, source })?;
    Ok(Bound::Owned { listener, path: path.to_path_buf(), file: identity(path) })
}
