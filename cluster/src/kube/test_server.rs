//! An API server for the adapter's unit tests, on 127.0.0.1.

use std::io::{BufRead, BufReader, Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Each request's line and body, as the server read them.
pub(super) type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// Answers each request (one per connection) with the next of `answers` (status, JSON body)
/// and records it; then holds the port without answering (later requests wait until the
/// test ends). Returns its URL.
pub(super) fn serve(answers: Vec<(u16, String)>) -> (String, Seen) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bound");
    let addr = listener.local_addr().expect("addr");
    let seen: Seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for (status, answer) in answers {
            let Ok((conn, _)) = listener.accept() else { return };
            if conn.set_read_timeout(Some(Duration::from_secs(30))).is_err() {
                return;
            }
            let mut reader = BufReader::new(conn);
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                return;
            }
            // The headers, up to the blank line.
            let mut length = 0usize;
            for _ in 0..100 {
                let mut h = String::new();
                if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
                    break;
                }
                if let Some((k, v)) = h.split_once(':')
                    && k.eq_ignore_ascii_case("content-length")
                {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0u8; length];
            if reader.read_exact(&mut body).is_err() {
                return;
            }
            log.lock().expect("log").push((line.trim().to_string(), String::from_utf8_lossy(&body).into_owned()));
            let mut conn = reader.into_inner();
            let head = format!(
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                answer.len()
            );
            if conn.write_all(head.as_bytes()).and_then(|()| conn.write_all(answer.as_bytes())).is_err() {
                return;
            }
        }
        let _kept = listener;
        std::thread::sleep(Duration::from_secs(60));
    });
    (format!("http://{addr}"), seen)
}
