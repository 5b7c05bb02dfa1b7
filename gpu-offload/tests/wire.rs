//! Wire compatibility: an independent raw-socket client sends hand-built big-endian frames and
//! checks the replies byte for byte.

mod common;

use std::io::Write;
use std::time::Duration;

use common::*;

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
        read_exactly(&mut stream, 12),
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
            read_exactly(&mut stream, 12 + payload.len()),
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
    let reply = read_exactly(&mut stream, 12 + 256);
    assert_eq!(&reply[..12], &[0, 0, 1, 12, 0, 0, 0, 5, 0, 0, 1, 0]);
    assert!(reply[12..].iter().copied().eq((0..=255u8).rev()));

    drop(stream);
    stack.stop_with(SIGINT, true);
}
