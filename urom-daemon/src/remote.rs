//! Hosts on other machines: the key file they must prove, the user their workers run as, and
//! the UCX listener they connect to (feature `ucx`).
//!
//! A remote host is let in like a local one (a connection permit, a session thread of its own, the
//! same hello deadline), but authenticates by proving the shared secret (see
//! `urom_core::auth`) instead of by Unix credentials, and owns its workers by the identity it
//! proved.

use std::fmt;

use nix::unistd::{Uid, User};
use urom_core::auth::{KeyFileError, SharedSecret};

use crate::RemoteHosts;
use crate::args::Args;

/// Why the daemon cannot serve remote hosts as asked.
#[derive(Debug)]
pub enum RemoteSetupError {
    /// `--listen-ucx` without `--key-file`.
    NoKeyFile,
    /// The key file cannot be used.
    KeyFile(KeyFileError),
    /// The daemon runs as root and was not told which user remote workers run as.
    NoRemoteUser,
    /// `--remote-user` names root.
    RootRemoteUser,
    /// `--remote-user` names no known user, or one the daemon cannot run workers as.
    RemoteUser {
        /// What was given.
        user: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// This build has no UCX.
    NoUcx,
    /// The UCX listener could not be set up.
    Listen {
        /// The address.
        address: std::net::SocketAddr,
        /// What UCX said.
        reason: String,
    },
}

impl fmt::Display for RemoteSetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoKeyFile => f.write_str(
                "--listen-ucx needs --key-file: hosts on other machines must prove a shared secret",
            ),
            Self::KeyFile(e) => write!(f, "{e}"),
            Self::NoRemoteUser => f.write_str(
                "--listen-ucx needs --remote-user when the daemon runs as root: the user that \
                 workers of hosts on other machines run as",
            ),
            Self::RootRemoteUser => {
                f.write_str("--remote-user root is refused: remote hosts never get root's rights")
            }
            Self::RemoteUser { user, reason } => write!(f, "--remote-user {user}: {reason}"),
            Self::NoUcx => f.write_str(
                "--listen-ucx: this urom-daemon was built without UCX (build it with --features ucx)",
            ),
            Self::Listen { address, reason } => {
                write!(f, "cannot listen for remote hosts on {address}: {reason}")
            }
        }
    }
}

impl std::error::Error for RemoteSetupError {}

/// What `--key-file` and `--remote-user` say, checked; `None` without `--listen-ucx`.
pub(crate) fn remote_hosts(args: &Args) -> Result<Option<RemoteHosts>, RemoteSetupError> {
    if args.listen_ucx.is_none() {
        return Ok(None);
    }
    if !cfg!(feature = "ucx") {
        return Err(RemoteSetupError::NoUcx);
    }
    let key_file = args.key_file.as_ref().ok_or(RemoteSetupError::NoKeyFile)?;
    let secret = SharedSecret::read(key_file).map_err(RemoteSetupError::KeyFile)?;
    let own_uid = nix::unistd::geteuid().as_raw();
    let uid = match (&args.remote_user, own_uid) {
        (None, 0) => return Err(RemoteSetupError::NoRemoteUser),
        (None, own) => own,
        (Some(user), own) => {
            let uid = resolve_user(user)?;
            if uid == 0 {
                return Err(RemoteSetupError::RootRemoteUser);
            }
            if own != 0 && uid != own {
                return Err(RemoteSetupError::RemoteUser {
                    user: user.clone(),
                    reason: format!(
                        "only a daemon running as root can run workers as another user (it runs as {own})"
                    ),
                });
            }
            uid
        }
    };
    Ok(Some(RemoteHosts { secret, uid }))
}

/// A user name or id, as a user id the user database knows.
fn resolve_user(user: &str) -> Result<u32, RemoteSetupError> {
    let bad = |reason: String| RemoteSetupError::RemoteUser {
        user: user.to_owned(),
        reason,
    };
    let found = match user.parse::<u32>() {
        Ok(uid) => User::from_uid(Uid::from_raw(uid)),
        Err(_) => User::from_name(user),
    };
    match found {
        Ok(Some(found)) => Ok(found.uid.as_raw()),
        Ok(None) => Err(bad("no such user".into())),
        Err(e) => Err(bad(format!("cannot look it up: {e}"))),
    }
}

/// Listens for hosts on other machines over UCX, on a thread of its own, until the daemon
/// stops; returns the address it listens on (with the port the system picked for port 0).
#[cfg(feature = "ucx")]
pub(crate) fn listen(
    service: &std::sync::Arc<crate::Service>,
    address: std::net::SocketAddr,
    next_host: std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> Result<std::net::SocketAddr, RemoteSetupError> {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use tracing::warn;
    use urom_core::transport::ChannelConfig;
    use urom_core::transport::ucx::UcxListener;

    let config = ChannelConfig::new(service.max_msg_size);
    let mut listener =
        UcxListener::bind(address, &config).map_err(|e| RemoteSetupError::Listen {
            address,
            reason: e.to_string(),
        })?;
    let bound = listener.local_addr();
    let service = Arc::clone(service);
    let mut failures = urom_cli::LogEvery::new(std::time::Duration::from_secs(1));
    std::thread::Builder::new()
        .name("urom-ucx-accept".into())
        .spawn(move || {
            while !service.stopping.load(Ordering::Relaxed) {
                match listener.accept(crate::ACCEPT_POLL) {
                    Ok(Some(connection)) => {
                        let host = next_host.fetch_add(1, Ordering::Relaxed);
                        admit(&service, host, connection.into(), bound);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        if let Some(held_back) = failures.allow(std::time::Instant::now()) {
                            warn!(held_back, "a remote host could not connect: {e}");
                        }
                    }
                }
            }
        })
        .map_err(|e| RemoteSetupError::Listen {
            address,
            reason: e.to_string(),
        })?;
    Ok(bound)
}

/// Serves a remote host on a thread of its own, within the connection bounds of the user its
/// workers run as.
#[cfg(feature = "ucx")]
fn admit(
    service: &std::sync::Arc<crate::Service>,
    host: crate::registry::HostId,
    channel: urom_core::transport::Channel,
    listening: std::net::SocketAddr,
) {
    use tracing::{error, warn};

    let Some(remote) = &service.remote else {
        return;
    };
    let permit = match service.gate.permit(remote.uid) {
        Ok(permit) => permit,
        Err(reason) => {
            warn!("remote host turned away: {reason}");
            return;
        }
    };
    let halves = urom_core::transport::stream::split_channel(channel);
    let client = crate::session::Client::Remote {
        address: format!("ucx via {listening}"),
    };
    let session_service = std::sync::Arc::clone(service);
    let spawned = std::thread::Builder::new()
        .name(format!("urom-host-{host}"))
        .spawn(move || crate::session::serve(&session_service, host, halves, client, permit));
    if let Err(e) = spawned {
        error!("cannot serve a remote host: {e}");
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use urom_cli::JsonArgs;

    use super::*;

    fn setup(extra: &[&str]) -> Result<Option<RemoteHosts>, RemoteSetupError> {
        let mut argv = vec!["urom-daemon", "--listen-ucx", "127.0.0.1:0"];
        argv.extend_from_slice(extra);
        remote_hosts(&Args::parse_with_json(argv).unwrap())
    }

    #[test]
    fn listening_for_remote_hosts_needs_ucx_a_private_key_file_and_a_user() {
        let none = remote_hosts(&Args::parse_with_json(["urom-daemon"]).unwrap());
        assert!(matches!(none, Ok(None)));
        if !cfg!(feature = "ucx") {
            let error = setup(&[]).err().unwrap();
            assert!(error.to_string().contains("--features ucx"), "{error}");
            return;
        }
        assert!(matches!(setup(&[]), Err(RemoteSetupError::NoKeyFile)));
        let dir = std::env::temp_dir().join(format!("urom-remote-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("key");
        std::fs::write(&key, "a secret of more than sixteen bytes").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
        let key_arg = key.to_str().unwrap();
        let error = setup(&["--key-file", key_arg]).err().unwrap();
        assert!(error.to_string().contains("chmod 600"), "{error}");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let root = nix::unistd::geteuid().is_root();
        match setup(&["--key-file", key_arg]) {
            Err(RemoteSetupError::NoRemoteUser) => assert!(root),
            Ok(Some(remote)) => assert_eq!(remote.uid, nix::unistd::geteuid().as_raw()),
            other => panic!("unexpected {other:?}"),
        }
        let error = setup(&["--key-file", key_arg, "--remote-user", "root"]).err();
        assert!(
            matches!(error, Some(RemoteSetupError::RootRemoteUser)),
            "{error:?}"
        );
        let error = setup(&["--key-file", key_arg, "--remote-user", "no-such-user-here"])
            .err()
            .unwrap();
        assert!(error.to_string().contains("no such user"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
