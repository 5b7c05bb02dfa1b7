//! Naming the channel: the `-c` name both sides are given says where the channel is, a Unix
//! socket on this machine or a UCX address ([`Endpoint`]).

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use super::error::ChannelError;

/// The channel name used when `-c/--comch-channel-name` is not given.
pub const DEFAULT_CHANNEL_NAME: &str = "dpu_gpu_remote_offload";
/// How a `-c` name that is a UCX address starts.
pub const UCX_SCHEME: &str = "ucx://";

/// The Unix socket of channel `name`: `name` itself when it contains a `/`, else
/// `$XDG_RUNTIME_DIR/gpu-offload-<name>.sock`, or `/tmp/gpu-offload-<name>.sock` without
/// `XDG_RUNTIME_DIR`.
pub fn socket_path(name: &str) -> PathBuf {
    if name.contains('/') {
        return PathBuf::from(name);
    }
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|dir| !dir.is_empty())
        .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    dir.join(format!("gpu-offload-{name}.sock"))
}

/// Where the channel is, as the `-c` name says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// Server and orchestrator on one machine: the control socket ([`socket_path`] of the
    /// name), data over shared memory.
    Local(PathBuf),
    /// Server and orchestrator on different machines (`ucx://IP:PORT`): the server listens for
    /// UCX connections on this address, the orchestrator connects to it. Needs the `ucx`
    /// build feature.
    Ucx(SocketAddr),
}

impl Endpoint {
    /// The endpoint a `-c` name names: `ucx://IP:PORT` (`ucx://192.0.2.1:7000`,
    /// `ucx://[2001:db8::1]:7000`) or else a channel name or socket path.
    pub fn parse(name: &str) -> Result<Self, ChannelError> {
        match name.strip_prefix(UCX_SCHEME) {
            Some(address) => address
                .parse()
                .map(Self::Ucx)
                .map_err(|_| ChannelError::BadName(name.to_owned())),
            None => Ok(Self::Local(socket_path(name))),
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Local(path) => write!(f, "{}", path.display()),
            Self::Ucx(address) => write!(f, "{UCX_SCHEME}{address}"),
        }
    }
}

/// Checks a `-c` name on the command line (see [`Endpoint::parse`]).
pub fn check_name(name: &str) -> Result<String, String> {
    Endpoint::parse(name)
        .map(|_| name.to_owned())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_paths_follow_the_name() {
        assert_eq!(socket_path("/x/y.sock"), PathBuf::from("/x/y.sock"));
        assert!(
            socket_path("abc")
                .to_string_lossy()
                .ends_with("/gpu-offload-abc.sock")
        );
    }

    #[test]
    fn names_choose_the_transport() {
        assert_eq!(
            Endpoint::parse("abc").unwrap(),
            Endpoint::Local(socket_path("abc"))
        );
        assert_eq!(
            Endpoint::parse("/x/y.sock").unwrap(),
            Endpoint::Local(PathBuf::from("/x/y.sock"))
        );
        let v4 = Endpoint::parse("ucx://192.0.2.1:7000").unwrap();
        assert_eq!(v4, Endpoint::Ucx(SocketAddr::from(([192, 0, 2, 1], 7000))));
        assert_eq!(v4.to_string(), "ucx://192.0.2.1:7000");
        let v6 = Endpoint::parse("ucx://[2001:db8::1]:7000").unwrap();
        assert_eq!(v6.to_string(), "ucx://[2001:db8::1]:7000");
        for bad in [
            "ucx://",
            "ucx://host:7000",
            "ucx://192.0.2.1",
            "ucx://192.0.2.1:70000",
        ] {
            let e = check_name(bad).unwrap_err();
            assert!(e.contains(bad) && e.contains("ucx://IP:PORT"), "{e}");
        }
        assert_eq!(check_name("abc").unwrap(), "abc");
    }
}
