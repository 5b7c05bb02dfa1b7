//! Hosts on other machines: the key file they must prove, the user their workers run as, and
//! the front door they connect to (`--listen-ucx`, feature `ucx`).
//!
//! The front door is a TCP socket the daemon parses itself; UCX never sees a byte of it, and
//! the daemon does not link UCX at all. A remote host is let in like a local one (a connection
//! permit, a session in the event loop, the same hello deadline: idle and half-open
//! connections are closed at it), but authenticates by proving the shared secret (see
//! `urom_transport::auth`) instead of by Unix credentials, owns its workers by the identity it
//! proved, and, until it has proved it, holds one of the few places of its source address
//! (`UNPROVEN`): one address flooding the port cannot keep hosts at others out. Everything
//! after the proofs travels in records with an integrity check; refusals and failed proofs are
//! logged at a bounded rate, with counts.

use std::fmt;

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use mio::net::TcpStream;
use nix::unistd::{Uid, User};
use urom_transport::auth::{KeyFileError, SharedSecret};
use urom_wire::Status;

use crate::args::Args;
use crate::event_loop::LoopWake;
use crate::gate::{self, Limits, Quota};
use crate::registry::HostId;
use crate::session::{Client, Session};
use crate::{RemoteHosts, Service};

/// Connections of hosts on other machines that have not proved the secret yet: at most this
/// many from one source address, and in all.
pub(crate) const UNPROVEN: Limits = Limits {
    total: 256,
    per_user: 32,
};

impl fmt::Debug for RemoteHosts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteHosts")
            .field("secret", &self.secret)
            .field("uid", &self.uid)
            .finish_non_exhaustive()
    }
}

impl RemoteHosts {
    /// Hosts on other machines that prove `secret`; their workers run as `uid`.
    pub(crate) fn new(secret: SharedSecret, uid: u32) -> Self {
        Self {
            secret,
            uid,
            unproven: Quota::new(UNPROVEN),
        }
    }
}

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
    /// The front door could not be set up.
    Listen {
        /// The address.
        address: SocketAddr,
        /// What the system said.
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
    Ok(Some(RemoteHosts::new(secret, uid)))
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

/// Binds the front door for hosts on other machines at `address`; the event loop serves it.
/// Returns the listener and the address it listens on (with the port the system picked for
/// port 0).
pub(crate) fn bind(address: SocketAddr) -> Result<(TcpListener, SocketAddr), RemoteSetupError> {
    let failed = |e: io::Error| RemoteSetupError::Listen {
        address,
        reason: e.to_string(),
    };
    let listener = TcpListener::bind(address).map_err(failed)?;
    let bound = listener.local_addr().map_err(failed)?;
    Ok((listener, bound))
}

/// Takes a connection to the front door: turns it away at once (the caller closes it) when its
/// source address or all remote hosts already hold their most unauthenticated connections, or
/// the remote user its most connections; else returns the session that serves it as host
/// `host`.
pub(crate) fn admit(
    service: &Arc<Service>,
    host: HostId,
    stream: &TcpStream,
    from: SocketAddr,
    wake: &Arc<LoopWake>,
) -> Option<Session> {
    let remote = service.remote.as_ref()?;
    let unproven = match remote.unproven.take(from.ip()) {
        Ok(place) => place,
        Err(gate::Full::Key(n)) => {
            let reason = format!(
                "{n} connections from {} are already authenticating",
                from.ip()
            );
            refuse(service, stream, from, &reason);
            return None;
        }
        Err(gate::Full::Total(n)) => {
            let reason = format!("{n} connections from other machines are already authenticating");
            refuse(service, stream, from, &reason);
            return None;
        }
    };
    let permit = match service.gate.permit(remote.uid) {
        Ok(permit) => permit,
        Err(reason) => {
            refuse(service, stream, from, &reason);
            return None;
        }
    };
    // Small frames leave at once (no Nagle delay).
    if let Err(e) = stream.set_nodelay(true) {
        service
            .gate
            .log_refusal(&from, &format!("cannot set up the connection: {e}"));
        return None;
    }
    let client = Client::Remote {
        address: from.to_string(),
    };
    Some(Session::new(
        service,
        host,
        client,
        (permit, Some(unproven)),
        wake,
    ))
}

/// Turns a connection away: the service is full for it.
fn refuse(service: &Service, stream: &TcpStream, from: SocketAddr, reason: &str) {
    let refusal = (Status::Full, reason);
    service
        .gate
        .turn_away(stream, &from, service.max_msg_size, refusal);
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
