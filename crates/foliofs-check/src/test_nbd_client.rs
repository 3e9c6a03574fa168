//! A minimal NBD client for tests: fixed newstyle, NBD_OPT_GO, simple
//! replies, one request at a time (or writes sent without waiting). It speaks the wire protocol directly so
//! that tests of the servers and proxies here do not depend on the engine's
//! client (`foliofs::dev::nbd::NbdDev`), whose reconnection they exist to
//! test.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use foliofs::dev::nbd::proto::{self, GoRequest, Info, Request};

/// How long a test waits for any answer before failing instead of hanging.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) struct TestNbdClient {
    stream: UnixStream,
    next_cookie: u64,
    pub size_bytes: u64,
}

impl TestNbdClient {
    /// Connects to the server (or proxy) at `socket` and opens `export`.
    pub fn connect(socket: &Path, export: &str) -> io::Result<Self> {
        let mut stream = UnixStream::connect(socket)?;
        stream.set_read_timeout(Some(ANSWER_TIMEOUT))?;
        let mut greeting = [0; 18];
        stream.read_exact(&mut greeting)?;
        if greeting[..8] != proto::NBD_MAGIC.to_be_bytes()
            || greeting[8..16] != proto::IHAVEOPT.to_be_bytes()
        {
            return Err(io::Error::other("not a newstyle NBD server"));
        }
        stream.write_all(&proto::CLIENT_FIXED_NEWSTYLE.to_be_bytes())?;
        let go = GoRequest { name: export.to_owned(), info_requests: Vec::new() };
        stream.write_all(&proto::encode_option(proto::OPT_GO, &go.encode()))?;
        let mut size_bytes = None;
        loop {
            let mut header = [0; proto::OPTION_REPLY_HEADER_BYTES];
            stream.read_exact(&mut header)?;
            let (_, reply_type, length) = proto::decode_option_reply_header(&header)?;
            let mut data = vec![0; length as usize];
            stream.read_exact(&mut data)?;
            match reply_type {
                proto::REP_INFO => {
                    if let Info::Export { size_bytes: size, .. } = Info::decode(&data)? {
                        size_bytes = Some(size);
                    }
                }
                proto::REP_ACK => break,
                other => return Err(io::Error::other(format!("NBD_OPT_GO refused: {other:#x}"))),
            }
        }
        let size_bytes = size_bytes.ok_or_else(|| io::Error::other("no export size"))?;
        Ok(Self { stream, next_cookie: 1, size_bytes })
    }

    pub fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let flags = if fua { proto::CMD_FLAG_FUA } else { 0 };
        let length = u32::try_from(data.len()).map_err(io::Error::other)?;
        self.request(proto::CMD_WRITE, flags, offset, length, data)?;
        Ok(())
    }

    /// Sends a WRITE and returns without waiting for its reply, as a
    /// client with requests in flight does.
    pub fn send_write(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        let length = u32::try_from(data.len()).map_err(io::Error::other)?;
        self.send(proto::CMD_WRITE, 0, offset, length, data)?;
        Ok(())
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.request(proto::CMD_FLUSH, 0, 0, 0, &[])?;
        Ok(())
    }

    pub fn read(&mut self, offset: u64, length: u32) -> io::Result<Vec<u8>> {
        self.request(proto::CMD_READ, 0, offset, length, &[])
    }

    fn send(
        &mut self,
        command: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> io::Result<u64> {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let request = Request { flags, command, cookie, offset, length };
        self.stream.write_all(&request.encode())?;
        self.stream.write_all(payload)?;
        Ok(cookie)
    }

    /// Sends one request and waits for its reply; a READ's data is returned.
    fn request(
        &mut self,
        command: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> io::Result<Vec<u8>> {
        let cookie = self.send(command, flags, offset, length, payload)?;
        let mut reply = [0; proto::SIMPLE_REPLY_BYTES];
        self.stream.read_exact(&mut reply)?;
        let mut magic = [0; 4];
        magic.copy_from_slice(&reply[..4]);
        let proto::ReplyHeader::Simple(header) = proto::ReplyHeader::decode(magic, &reply[4..])?
        else {
            return Err(io::Error::other("a structured reply nobody asked for"));
        };
        if header.cookie != cookie {
            return Err(io::Error::other(format!("reply for cookie {}", header.cookie)));
        }
        if header.error != 0 {
            return Err(io::Error::other(format!("NBD error {}", header.error)));
        }
        let mut data = Vec::new();
        if command == proto::CMD_READ {
            data.resize(length as usize, 0);
            self.stream.read_exact(&mut data)?;
        }
        Ok(data)
    }
}
