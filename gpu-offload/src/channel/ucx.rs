//! The channel across machines (feature `ucx`): the control connection and the data
//! connections are urom UCX connections.
//!
//! The server listens on the `-c ucx://IP:PORT` address with the control connection's fixed
//! settings ([`control_config`]), so that any two builds can exchange hellos whatever their
//! flags; once they agree, it listens for the data connections on another port of the same
//! address, with frames of the agreed size, and names that port on the control connection.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use urom_transport::ucx::{UcxConnectError, UcxConnection, UcxListener};
use urom_transport::{ChannelConfig, ConnectError};
use urom_wire::MaxMsgSize;
use urom_wire::gpu::channel::{DataHelloRepr, DataListenerRepr};

use super::connections::{DataConnections, OrchestratorChannel, ServerChannel};
use super::control::Control;
use super::error::{ChannelError, ListenCause};
use super::params::{ChannelParams, STEP_TIMEOUT, TICK};
use super::setup::{
    SetupLink, check_data_hello, exchange_as_orchestrator, exchange_as_server, orchestrator_hellos,
    recv_one, send_frame, server_hellos,
};

/// How long the orchestrator waits between attempts to reach a server that is not there yet.
const RETRY: Duration = Duration::from_millis(250);

/// The settings of every UCX control connection: small frames, a few slots. Never derived
/// from flags: a mismatch here would fail in UCX's handshake, before the hellos could say what
/// differs.
pub fn control_config() -> ChannelConfig {
    ChannelConfig {
        max_msg_size: MaxMsgSize::DEFAULT,
        slots: 8,
        handshake_timeout: STEP_TIMEOUT,
        ..ChannelConfig::default()
    }
}

impl SetupLink for UcxConnection {
    fn put(&mut self, record: &[u8]) -> Result<(), ChannelError> {
        send_frame(self, record, "during the channel setup")
    }

    fn get<R>(
        &mut self,
        _len: usize,
        when: &'static str,
        read: impl FnOnce(&[u8]) -> Result<R, ChannelError>,
    ) -> Result<R, ChannelError> {
        recv_one(self, when, read)
    }
}

/// The server's UCX listener for the orchestrator's control connection.
pub(super) struct Listener {
    control: UcxListener,
    address: SocketAddr,
    /// Orchestrators told that this server has one, kept a moment so that the busy hello
    /// reaches them before the connection closes.
    refused: Vec<(UcxConnection, Instant)>,
}

/// How long a refused orchestrator's connection is kept open.
const REFUSED_LINGER: Duration = Duration::from_secs(2);

impl Listener {
    /// Listens on `address` (port 0: any free port). The port is reused even while
    /// connections of an earlier run hold it in TCP TIME-WAIT, so that a server restarted after
    /// a crash gets its address back (unless `UCX_TCP_CM_REUSEADDR` says otherwise).
    pub(super) fn bind(address: SocketAddr) -> Result<Self, ChannelError> {
        urom_transport::ucx::set_config_defaults(&[("TCP_CM_REUSEADDR", "y")]);
        let control =
            UcxListener::bind(address, &control_config()).map_err(|e| ChannelError::ListenUcx {
                address,
                source: e.into(),
                cause: probe(address),
            })?;
        Ok(Self {
            control,
            address,
            refused: Vec::new(),
        })
    }

    /// Where it listens, with the real port.
    pub(super) fn local_addr(&self) -> SocketAddr {
        self.control.local_addr()
    }

    /// Answers every orchestrator waiting to connect with a busy hello, without waiting: this
    /// server has one.
    pub(super) fn refuse_waiting(&mut self, ours: &ChannelParams) {
        self.refused.retain(|(_, at)| at.elapsed() < REFUSED_LINGER);
        while let Ok(Some(mut conn)) = self.control.accept(Duration::ZERO) {
            if conn.put(&ours.busy_hello()).is_ok() {
                tracing::warn!(
                    "another orchestrator connected; told it that this server already has one"
                );
                self.refused.push((conn, Instant::now()));
            }
        }
    }

    /// Waits for the orchestrator (until `stop`), agrees on `ours`, listens for the data
    /// connections and sets them up.
    pub(super) fn accept(
        &mut self,
        ours: &ChannelParams,
        stop: &AtomicBool,
    ) -> Result<ServerChannel, ChannelError> {
        let control = accept_until(
            &mut self.control,
            stop,
            None,
            "waiting for the orchestrator",
        )?;
        self.set_up(control, ours, stop)
    }

    /// As [`Self::accept`] if an orchestrator is connecting now; `Ok(None)` at once if none.
    pub(super) fn try_accept(
        &mut self,
        ours: &ChannelParams,
        stop: &AtomicBool,
    ) -> Result<Option<ServerChannel>, ChannelError> {
        match self.control.accept(Duration::ZERO) {
            Ok(Some(control)) => self.set_up(control, ours, stop).map(Some),
            Ok(None) => Ok(None),
            Err(e) => Err(ChannelError::AcceptUcx(e.into())),
        }
    }

    /// The setup after the orchestrator's control connection came.
    fn set_up(
        &mut self,
        mut control: UcxConnection,
        ours: &ChannelParams,
        stop: &AtomicBool,
    ) -> Result<ServerChannel, ChannelError> {
        let params = server_hellos(&mut control, ours)?;
        let config = params.channel_config()?;
        let at = SocketAddr::new(self.address.ip(), 0);
        let mut listener = UcxListener::bind(at, &config).map_err(|e| ChannelError::ListenUcx {
            address: at,
            source: e.into(),
            cause: probe(at),
        })?;
        let port = listener.local_addr().port();
        tracing::debug!(port, "listening for the data connections");
        control.put(&DataListenerRepr { port }.to_bytes())?;
        let deadline = Instant::now() + STEP_TIMEOUT;
        let mut data = Vec::with_capacity(params.threads as usize);
        for index in 0..params.threads {
            let mut conn = accept_until(&mut listener, stop, Some(deadline), "data connections")?;
            recv_one(
                &mut conn,
                "before announcing a data connection",
                |announce| check_data_hello(announce, index),
            )?;
            exchange_as_server(&mut conn, index, params.max_message_length)?;
            data.push(conn);
        }
        Ok(ServerChannel {
            control: Control::ucx(control),
            data: DataConnections::Ucx(data),
            params,
        })
    }
}

/// Why `address` cannot be listened on: binds a socket of our own to it (an address of
/// another machine fails), then looks for the sockets that hold its port in this network
/// namespace's `/proc/net/tcp` and `/proc/net/tcp6`.
fn probe(address: SocketAddr) -> ListenCause {
    use nix::errno::Errno;
    use nix::sys::socket::{
        AddressFamily, SockFlag, SockType, SockaddrStorage, bind, setsockopt, socket, sockopt,
    };
    use std::os::fd::AsRawFd;
    let family = if address.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let bound = socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).and_then(|s| {
        setsockopt(&s, sockopt::ReuseAddr, &true)?;
        bind(s.as_raw_fd(), &SockaddrStorage::from(address))
    });
    if bound == Err(Errno::EADDRNOTAVAIL) {
        return ListenCause::NotLocal;
    }
    let states = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .flat_map(|table| port_states(&table, address.port()))
        .collect::<Vec<_>>();
    cause_of(&states)
}

/// The TCP states (`/proc/net/tcp`'s hex `st`) of the sockets bound to `port` in `table`.
fn port_states(table: &str, port: u16) -> Vec<u8> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let local = fields.nth(1)?;
            let state = fields.nth(1)?;
            let (_, local_port) = local.rsplit_once(':')?;
            (u16::from_str_radix(local_port, 16).ok()? == port)
                .then(|| u8::from_str_radix(state, 16).ok())
                .flatten()
        })
        .collect()
}

/// What the sockets on a port, by TCP state, say about why it cannot be listened on.
fn cause_of(states: &[u8]) -> ListenCause {
    /// `TCP_LISTEN` in the kernel's numbering.
    const LISTEN: u8 = 0x0a;
    if states.contains(&LISTEN) {
        ListenCause::PortTaken
    } else if states.is_empty() {
        ListenCause::Unknown
    } else {
        ListenCause::Lingering
    }
}

/// The next connection on `listener`, waiting until `stop` is set or `deadline` passes.
fn accept_until(
    listener: &mut UcxListener,
    stop: &AtomicBool,
    deadline: Option<Instant>,
    what: &'static str,
) -> Result<UcxConnection, ChannelError> {
    loop {
        if stop.load(Ordering::Relaxed) {
            return Err(ChannelError::Stopped);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(ChannelError::Timeout(what));
        }
        match listener.accept(TICK) {
            Ok(Some(conn)) => return Ok(conn),
            Ok(None) => {}
            Err(e) => return Err(ChannelError::AcceptUcx(e.into())),
        }
    }
}

/// Connects to the server's UCX listener at `address`, retrying until it listens, `stop` is
/// set or `wait` passes; agrees on `ours` and sets up the data connections.
pub(super) fn connect(
    address: SocketAddr,
    ours: &ChannelParams,
    wait: Duration,
    stop: &AtomicBool,
) -> Result<OrchestratorChannel, ChannelError> {
    let deadline = Instant::now() + wait;
    let mut control = loop {
        match UcxConnection::connect(address, &control_config()) {
            Ok(conn) => break conn,
            Err(e @ UcxConnectError::Unreachable { .. }) => {
                if stop.load(Ordering::Relaxed) {
                    return Err(ChannelError::Stopped);
                }
                if Instant::now() >= deadline {
                    return Err(ChannelError::ConnectUcx {
                        address,
                        source: e.into(),
                    });
                }
                std::thread::sleep(RETRY);
            }
            Err(e) => {
                return Err(ChannelError::ConnectUcx {
                    address,
                    source: e.into(),
                });
            }
        }
    };
    let params = orchestrator_hellos(&mut control, ours)?;
    let config = params.channel_config()?;
    let port = recv_one(&mut control, "before naming its data listener", |record| {
        DataListenerRepr::parse(record).map_err(|_| ChannelError::NotAPeer)
    })?
    .port;
    let data_address = SocketAddr::new(address.ip(), port);
    let mut data = Vec::with_capacity(params.threads as usize);
    for index in 0..params.threads {
        let mut conn = UcxConnection::connect(data_address, &config)
            .map_err(|e| ChannelError::DataSetup(ConnectError::from(e)))?;
        send_frame(
            &mut conn,
            &DataHelloRepr { thread: index }.to_bytes(),
            "announcing a data connection",
        )?;
        exchange_as_orchestrator(&mut conn, index, params.max_message_length)?;
        data.push(conn);
    }
    Ok(OrchestratorChannel {
        control: Control::ucx(control),
        data: DataConnections::Ucx(data),
        params,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sockets_on_a_port_name_the_cause() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:9CAF 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:9CB0 0100007F:8BC2 06 00000000:00000000 03:00001770 00000000     0        0 0 3 0000000000000000
";
        assert_eq!(port_states(table, 0x9caf), [0x0a]);
        assert_eq!(
            cause_of(&port_states(table, 0x9caf)),
            ListenCause::PortTaken
        );
        assert_eq!(
            cause_of(&port_states(table, 0x9cb0)),
            ListenCause::Lingering
        );
        assert_eq!(cause_of(&port_states(table, 1)), ListenCause::Unknown);
    }
}
