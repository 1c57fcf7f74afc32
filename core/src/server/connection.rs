//! One client connection: frames received whole under the timeouts and the byte
//! budget, then handed to [`super::handler`].

use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::protocol::{self, ErrorCode, LEN_BYTES, REQUEST_HEADER};

use super::auth::Window;
use super::handler;
use super::reply::{busy_message, refuse, ConnError};
use super::Shared;

/// A receive buffer grown past this for one large frame is given back afterwards, so
/// idle connections do not each keep a maximum-sized frame allocated.
const KEEP_BODY: usize = 2 << 20;

/// How a read of part of a frame failed.
enum PartError {
    /// The peer closed the connection.
    Eof,
    /// The request timeout passed.
    TimedOut,
    /// Anything else.
    Io(io::Error),
}

/// The receiving half of a connection.
struct Incoming {
    reader: BufReader<TcpStream>,
    /// The socket's current receive timeout, to skip needless system calls.
    read_timeout: Option<Duration>,
}

impl Incoming {
    fn set_read_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        if self.read_timeout != timeout {
            self.reader.get_ref().set_read_timeout(timeout)?;
            self.read_timeout = timeout;
        }
        Ok(())
    }

    /// Fills `buf`, all of it by `deadline` (`request_timeout` after the frame began).
    fn read_part(
        &mut self,
        buf: &mut [u8],
        deadline: Option<Instant>,
        request_timeout: Option<Duration>,
    ) -> std::result::Result<(), PartError> {
        let mut pos = 0;
        while pos < buf.len() {
            if let Some(deadline) = deadline {
                if Instant::now() >= deadline {
                    return Err(PartError::TimedOut);
                }
                // The socket timeout is set once per frame, not per read; the deadline
                // is checked after every read, so a client trickling bytes is cut off
                // within twice the request timeout.
                if self.reader.buffer().is_empty() {
                    self.set_read_timeout(request_timeout)
                        .map_err(PartError::Io)?;
                }
            }
            match self.reader.read(&mut buf[pos..]) {
                Ok(0) => return Err(PartError::Eof),
                Ok(n) => pos += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_timeout(&e) => return Err(PartError::TimedOut),
                Err(e) => return Err(PartError::Io(e)),
            }
        }
        Ok(())
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// One client connection being served.
struct Conn<'a> {
    shared: &'a Shared,
    incoming: Incoming,
    writer: BufWriter<TcpStream>,
    /// What the client may reach; `None` until its hello is accepted.
    window: Option<Window>,
    body: Vec<u8>,
    out: Vec<u8>,
}

pub(super) fn serve_connection(
    shared: &Shared,
    stream: TcpStream,
) -> std::result::Result<(), ConnError> {
    let config = &shared.config;
    stream.set_nodelay(true)?;
    stream.set_write_timeout(config.request_timeout.or(config.idle_timeout))?;
    let mut conn = Conn {
        shared,
        incoming: Incoming {
            reader: BufReader::with_capacity(64 * 1024, stream.try_clone()?),
            read_timeout: None,
        },
        writer: BufWriter::with_capacity(64 * 1024, stream),
        window: None,
        body: Vec::new(),
        out: Vec::new(),
    };
    loop {
        if !conn.wait_for_frame()? {
            return Ok(());
        }
        if shared.hub.is_stopping() {
            return Ok(());
        }
        conn.serve_frame()?;
        // Flush only when no further request is already waiting: pipelined requests
        // get their replies in one batch.
        if conn.incoming.reader.buffer().is_empty() {
            conn.writer.flush()?;
        }
        if conn.body.capacity() > KEEP_BODY {
            conn.body = Vec::new();
        }
    }
}

impl Conn<'_> {
    /// Waits until the next frame starts; false when the client closed the connection.
    /// Before the hello the wait is the request timeout, after it the idle timeout.
    fn wait_for_frame(&mut self) -> std::result::Result<bool, ConnError> {
        if !self.incoming.reader.buffer().is_empty() {
            return Ok(true);
        }
        let config = &self.shared.config;
        let (wait, code) = if self.window.is_some() {
            (config.idle_timeout, ErrorCode::IdleTimeout)
        } else {
            (
                config.request_timeout.or(config.idle_timeout),
                ErrorCode::RequestTimeout,
            )
        };
        self.incoming.set_read_timeout(wait)?;
        loop {
            match self.incoming.reader.fill_buf() {
                Ok([]) => return Ok(false),
                Ok(_) => return Ok(true),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_timeout(&e) => {
                    let wait = wait.unwrap_or_default();
                    let message = if code == ErrorCode::IdleTimeout {
                        format!("connection idle for {wait:?}: closed by the server")
                    } else {
                        format!("no hello within {wait:?}: connection closed by the server")
                    };
                    refuse(self.shared, &mut self.writer, 0, code, message)?;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Turns a failed part read into the connection's end, telling the client why.
    fn part_failed(&mut self, e: PartError, part: &str) -> ConnError {
        match e {
            PartError::Eof => ConnError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("client closed the connection in the middle of a frame's {part}"),
            )),
            PartError::Io(e) => e.into(),
            PartError::TimedOut => {
                let t = self.shared.config.request_timeout.unwrap_or_default();
                let id = protocol::peek_id(&self.body);
                let message =
                    format!("the {part} of a frame did not arrive within {t:?}: connection closed");
                match refuse(
                    self.shared,
                    &mut self.writer,
                    id,
                    ErrorCode::RequestTimeout,
                    message,
                ) {
                    Err(e) => e,
                    Ok(()) => ConnError::Refused("request timeout".into()),
                }
            }
        }
    }

    /// Receives one whole frame and answers it.
    fn serve_frame(&mut self) -> std::result::Result<(), ConnError> {
        let shared = self.shared;
        let config = &shared.config;
        let deadline = config.request_timeout.map(|t| Instant::now() + t);
        let mut len = [0u8; LEN_BYTES];
        self.body.clear();
        if let Err(e) = self
            .incoming
            .read_part(&mut len, deadline, config.request_timeout)
        {
            return Err(self.part_failed(e, "length"));
        }
        let len = u32::from_le_bytes(len);
        let len = match protocol::check_frame_len(len, config.max_frame, REQUEST_HEADER) {
            Ok(len) => len,
            Err(e) => {
                let code = if matches!(e, protocol::ProtocolError::TooLarge { .. }) {
                    ErrorCode::FrameTooLarge
                } else {
                    ErrorCode::Malformed
                };
                return refuse(shared, &mut self.writer, 0, code, e.to_string());
            }
        };
        // The frame's bytes count against the server's budget while they are buffered.
        let Some(_body_grant) = shared.budget.take(len as u64, config.in_flight_wait) else {
            shared.counters.busy.fetch_add(1, Ordering::Relaxed);
            return refuse(
                shared,
                &mut self.writer,
                0,
                ErrorCode::Busy,
                busy_message(shared, len as u64),
            );
        };
        self.body.resize(len, 0);
        if let Err(e) = self
            .incoming
            .read_part(&mut self.body, deadline, config.request_timeout)
        {
            return Err(self.part_failed(e, "body"));
        }
        shared.counters.requests.fetch_add(1, Ordering::Relaxed);
        let out = &mut self.out;
        let writer = &mut self.writer;
        out.clear();
        let (id, request) = match protocol::decode_request(&self.body) {
            Ok(r) => r,
            Err(e) => {
                let id = protocol::peek_id(&self.body);
                return refuse(shared, writer, id, ErrorCode::Malformed, e.to_string());
            }
        };
        handler::handle(shared, &mut self.window, writer, out, id, request)
    }
}
