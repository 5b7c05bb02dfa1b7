//! Wire compatibility: an independent raw-socket client sends hand-built big-endian frames and
//! checks the replies byte for byte.

mod common;

use std::io::Write;
use std::time::Duration;

use common::*;
use urom_wire::gpu::CLIENT_HEADER_LEN;

#[test]
fn hand_built_frames_get_byte_exact_replies() {
    let stack = Stack::two_threads();
    let mut stream = stack.connect();

    // wire_size 16, msg_id 4 (client_request), length 4, "ABCD".
    let request = [0, 0, 0, 16, 0, 0, 0, 4, 0, 0, 0, 4, b'A', b'B', b'C', b'D'];
    stream.write_all(&request).unwrap();
    // wire_size 16, msg_id 5 (client_response), length 4, "DCBA".
    let reply = [0, 0, 0, 16, 0, 0, 0, 5, 0, 0, 0, 4, b'D', b'C', b'B', b'A'];
    assert_eq!(read_exactly(&mut stream, 16), reply);

    // An empty payload.
    stream
        .write_all(&[0, 0, 0, 12, 0, 0, 0, 4, 0, 0, 0, 0])
        .unwrap();
    assert_eq!(
        read_exactly(&mut stream, CLIENT_HEADER_LEN),
        [0, 0, 0, 12, 0, 0, 0, 5, 0, 0, 0, 0]
    );

    // Three frames in one write: three replies, in order.
    let mut batch = Vec::new();
    for payload in [&b"one"[..], b"two!", b"three"] {
        batch.extend(request_frame(payload));
    }
    stream.write_all(&batch).unwrap();
    for payload in [&b"eno"[..], b"!owt", b"eerht"] {
        assert_eq!(
            read_exactly(&mut stream, CLIENT_HEADER_LEN + payload.len()),
            frame(5, payload)
        );
    }

    // One frame trickled in byte by byte: the server waits for the rest.
    let trickled = request_frame(b"slow bytes");
    for byte in &trickled {
        stream.write_all(&[*byte]).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(
        read_exactly(&mut stream, trickled.len()),
        frame(5, b"setyb wols")
    );

    // The longest payload the server allows (default 256), every byte value.
    let payload: Vec<u8> = (0..=255u8).collect();
    stream.write_all(&request_frame(&payload)).unwrap();
    let reply = read_exactly(&mut stream, CLIENT_HEADER_LEN + 256);
    let (header, payload) = reply.split_at(CLIENT_HEADER_LEN);
    assert_eq!(header, &[0, 0, 1, 12, 0, 0, 0, 5, 0, 0, 1, 0]);
    assert!(payload.iter().copied().eq((0..=255u8).rev()));

    drop(stream);
    stack.stop_with(SIGINT, true);
}

#[test]
fn the_client_reads_responses_that_straddle_reads() {
    use std::io::Read;
    use std::net::TcpListener;

    use gpu_offload::client::{self, ClientConfig};

    // A server of the test's own that answers in pieces cut across message boundaries: 1 byte,
    // 5 bytes, 13 bytes, ... with a pause after each so that each arrives in its own read.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    const COUNT: usize = 20;
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream.set_nodelay(true).unwrap();
        let request = request_frame(b"straddle");
        let mut got = vec![0u8; request.len() * COUNT];
        let mut answers = Vec::new();
        for _ in 0..COUNT {
            answers.extend(frame(5, b"elddarts"));
        }
        let (mut read, mut written, mut piece) = (0, 0, 1);
        while written < answers.len() {
            // Answer only what has been asked; read more once all of it is answered.
            let asked = (read / request.len()) * 20;
            if written == asked {
                read += stream.read(&mut got[read..]).unwrap();
                continue;
            }
            let end = (written + piece).min(asked);
            stream.write_all(&answers[written..end]).unwrap();
            written = end;
            piece = piece % 17 + 4;
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(got.chunks(request.len()).all(|r| r == request.as_slice()));
    });
    let stats = client::run(&ClientConfig {
        server: addr,
        threads: 1,
        iterations: COUNT as u64,
        message: b"straddle".to_vec(),
        expected: b"elddarts".to_vec(),
        pipeline: 4,
        timeout: TIMEOUT,
    })
    .expect("every response parsed and checked");
    assert_eq!(stats.operations, COUNT as u64);
    server.join().unwrap();
}
