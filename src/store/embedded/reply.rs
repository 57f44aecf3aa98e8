//! A command's answer as the embedded keyspace gives it (RESP2's kinds), and its form as
//! `redis::Value`, which the Redis store's glue reads.

use redis::Value;

/// One answer, as Redis would send it over RESP2.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Nil,
    Int(i64),
    Bulk(Vec<u8>),
    Status(String),
    Array(Vec<Reply>),
    /// The whole error line without its `-`: the code, a space, the message (`ERR no such key`).
    Error(String),
}

impl Reply {
    pub fn ok() -> Self {
        Reply::Status("OK".into())
    }

    pub fn err(msg: impl Into<String>) -> Self {
        Reply::Error(msg.into())
    }

    pub fn bulk(b: impl Into<Vec<u8>>) -> Self {
        Reply::Bulk(b.into())
    }

    /// An array of bulk strings.
    pub fn bulks<I: IntoIterator<Item = Vec<u8>>>(items: I) -> Self {
        Reply::Array(items.into_iter().map(Reply::Bulk).collect())
    }

    /// The same answer as the redis crate reads it off the wire.
    pub fn into_value(self) -> Value {
        match self {
            Reply::Nil => Value::Nil,
            Reply::Int(i) => Value::Int(i),
            Reply::Bulk(b) => Value::BulkString(b),
            Reply::Status(s) if s == "OK" => Value::Okay,
            Reply::Status(s) => Value::SimpleString(s),
            Reply::Array(items) => Value::Array(items.into_iter().map(Reply::into_value).collect()),
            Reply::Error(line) => error_value(&line),
        }
    }
}

/// `line` (`CODE message`) as the redis crate parses an error reply, so that its code and
/// detail read as a real server's.
fn error_value(line: &str) -> Value {
    let clean: String = line.chars().map(|c| if c == '\r' || c == '\n' { ' ' } else { c }).collect();
    let wire = format!("-{clean}\r\n");
    redis::parse_redis_value(wire.as_bytes()).unwrap_or(Value::Nil)
}

/// The standard error lines.
pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
pub const NOT_INTEGER: &str = "ERR value is not an integer or out of range";
pub const NOT_FLOAT: &str = "ERR value is not a valid float";
pub const SYNTAX: &str = "ERR syntax error";
