//! The CLI's one error type: what went wrong, said once on stderr, and the exit status.

use std::fmt;
use std::io;

#[derive(Debug)]
pub enum Error {
    /// The reader of the output went away (`gpumemtrace summary ... | head`): not a failure.
    BrokenPipe,
    /// A failure to tell on stderr as `gpumemtrace: message` (`gpumemtrace check: message`
    /// with a command), ending the process with `status`.
    Failed { message: String, command: Option<&'static str>, status: u8 },
}

impl Error {
    /// A failure with exit status 1.
    pub fn new(message: impl Into<String>) -> Error {
        Error::Failed { message: message.into(), command: None, status: 1 }
    }

    /// The same failure, ending with `status`.
    pub fn status(self, status: u8) -> Error {
        match self {
            Error::Failed { message, command, .. } => Error::Failed { message, command, status },
            e => e,
        }
    }

    /// The same failure, told as one of `command`'s (`gpumemtrace check: ...`).
    pub fn of(self, command: &'static str) -> Error {
        match self {
            Error::Failed { message, status, .. } => Error::Failed { message, command: Some(command), status },
            e => e,
        }
    }

    /// Tells the failure on stderr; returns the exit status.
    pub fn report(&self) -> u8 {
        match self {
            Error::BrokenPipe => 0,
            Error::Failed { message, command, status } => {
                match command {
                    Some(c) => eprintln!("gpumemtrace {c}: {message}"),
                    None => eprintln!("gpumemtrace: {message}"),
                }
                *status
            }
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::BrokenPipe => write!(f, "broken pipe"),
            Error::Failed { message, .. } => write!(f, "{message}"),
        }
    }
}

impl From<String> for Error {
    fn from(message: String) -> Error {
        Error::new(message)
    }
}

impl From<&str> for Error {
    fn from(message: &str) -> Error {
        Error::new(message)
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Error {
        match e.kind() {
            io::ErrorKind::BrokenPipe => Error::BrokenPipe,
            _ => Error::new(e.to_string()),
        }
    }
}

/// A JSON writer's error as an I/O error of the same kind (a broken pipe stays one).
pub fn json_error(e: serde_json::Error) -> io::Error {
    match e.io_error_kind() {
        Some(kind) => io::Error::new(kind, e),
        None => io::Error::other(e),
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_pipe_is_no_failure_and_statuses_carry() {
        let e: Error = io::Error::from(io::ErrorKind::BrokenPipe).into();
        assert_eq!(e.report(), 0);
        assert_eq!(Error::new("x").status(2).of("check").report(), 2);
    }
}
