//! The steps of the setup that every transport shares: the hellos on the control connection,
//! then, on each data connection, its announcement and the consumer-id exchange.

use std::time::Instant;

use urom_transport::{FrameSendError, Transport};
use urom_wire::gpu::GpuMessage;
use urom_wire::gpu::channel::{CHANNEL_HELLO_LEN, DataHelloRepr};

use super::error::ChannelError;
use super::params::{BUSY_THREADS, ChannelParams, STEP_TIMEOUT, TICK, agree};

/// A control connection while the channel is set up: whole records each way.
pub(super) trait SetupLink {
    /// Sends `record` whole.
    fn put(&mut self, record: &[u8]) -> Result<(), ChannelError>;

    /// Receives one record of `len` bytes (a whole frame, where the link has frames) and hands
    /// it to `read`; `when` says what was awaited, for errors.
    fn get<R>(
        &mut self,
        len: usize,
        when: &'static str,
        read: impl FnOnce(&[u8]) -> Result<R, ChannelError>,
    ) -> Result<R, ChannelError>;
}

/// The server's half of the hellos: takes the orchestrator's, answers with `ours` whatever it
/// said (so that an orchestrator of another version sees the difference too), then checks it.
/// Returns what both sides agreed on.
pub(super) fn server_hellos(
    link: &mut impl SetupLink,
    ours: &ChannelParams,
) -> Result<ChannelParams, ChannelError> {
    let theirs = link.get(CHANNEL_HELLO_LEN, "before its hello", |hello| {
        Ok(ChannelParams::from_hello(hello))
    })?;
    link.put(&ours.hello())?;
    agree(ours, &theirs?)?;
    Ok(*ours)
}

/// The orchestrator's half of the hellos: sends `ours`, takes the server's and checks it.
/// Returns what both sides agreed on (the server's `max_concurrent`).
pub(super) fn orchestrator_hellos(
    link: &mut impl SetupLink,
    ours: &ChannelParams,
) -> Result<ChannelParams, ChannelError> {
    link.put(&ours.hello())?;
    let server = link.get(
        CHANNEL_HELLO_LEN,
        "before its hello",
        ChannelParams::from_hello,
    )?;
    if server.threads == BUSY_THREADS {
        return Err(ChannelError::ServerBusy);
    }
    agree(&server, ours)?;
    Ok(ChannelParams {
        max_concurrent: server.max_concurrent,
        ..*ours
    })
}

/// Checks that a data connection announces thread `index`.
pub(super) fn check_data_hello(announce: &[u8], index: u32) -> Result<(), ChannelError> {
    if DataHelloRepr::parse(announce) == Ok(DataHelloRepr { thread: index }) {
        Ok(())
    } else {
        Err(ChannelError::NotAPeer)
    }
}

/// Receives one frame within [`STEP_TIMEOUT`] and hands it to `read`; `when` says what was
/// awaited, for errors.
pub(super) fn recv_one<T: Transport, R>(
    conn: &mut T,
    when: &'static str,
    read: impl FnOnce(&[u8]) -> Result<R, ChannelError>,
) -> Result<R, ChannelError> {
    let gone = |_| ChannelError::PeerGone(when);
    if !conn.wait_recv(STEP_TIMEOUT).map_err(gone)? {
        return Err(ChannelError::Timeout(when));
    }
    let frame = conn
        .recv()
        .map_err(gone)?
        .ok_or(ChannelError::Timeout(when))?;
    read(frame)
}

/// Sends one frame, waiting (at most [`STEP_TIMEOUT`]) while the peer's slots are full.
pub(super) fn send_frame<T: Transport>(
    conn: &mut T,
    frame: &[u8],
    when: &'static str,
) -> Result<(), ChannelError> {
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        match conn.send(frame) {
            Ok(()) => return Ok(()),
            Err(FrameSendError::Full) if Instant::now() < deadline => {
                conn.wait_send(TICK)
                    .map_err(|_| ChannelError::PeerGone(when))?;
            }
            Err(FrameSendError::Full) => {
                return Err(ChannelError::Timeout(when));
            }
            Err(_) => return Err(ChannelError::PeerGone(when)),
        }
    }
}

fn send_one<T: Transport>(conn: &mut T, message: GpuMessage<'_>) -> Result<(), ChannelError> {
    let mut buf = [0u8; 16];
    let len = message
        .emit(&mut buf, 0)
        .map_err(|_| ChannelError::ConsumerId("cannot encode the message"))?;
    send_frame(conn, &buf[..len], "during the consumer id exchange")
}

pub(super) fn exchange_as_server<T: Transport>(
    conn: &mut T,
    index: u32,
    max: u32,
) -> Result<(), ChannelError> {
    send_one(conn, GpuMessage::ConsumerIdRequest { consumer_id: index })?;
    recv_one(
        conn,
        "during the consumer id exchange",
        |frame| match GpuMessage::parse(frame, max as usize) {
            Ok(GpuMessage::ConsumerIdResponse { .. }) => Ok(()),
            _ => Err(ChannelError::ConsumerId(
                "the orchestrator did not answer with exchange_consumer_id_response",
            )),
        },
    )
}

pub(super) fn exchange_as_orchestrator<T: Transport>(
    conn: &mut T,
    index: u32,
    max: u32,
) -> Result<(), ChannelError> {
    recv_one(
        conn,
        "during the consumer id exchange",
        |frame| match GpuMessage::parse(frame, max as usize) {
            Ok(GpuMessage::ConsumerIdRequest { consumer_id }) if consumer_id == index => Ok(()),
            _ => Err(ChannelError::ConsumerId(
                "the server did not send this thread's exchange_consumer_id_request",
            )),
        },
    )?;
    send_one(conn, GpuMessage::ConsumerIdResponse { consumer_id: index })
}
