//! Range scans (RANGE_SCAN_CREATE, RANGE_SCAN_CONTINUE, RANGE_SCAN_CANCEL) on one
//! vBucket.

use crate::client::Client;
use crate::error::{Error, Result};
use crate::response::Response;
use epkv_protocol::range_scan::ContinueRequest;
use epkv_protocol::{Command, RequestBuilder, Status};
use epkv_types::Vbid;
use tokio::io::{AsyncRead, AsyncWrite};

/// Most responses one continue may take before the client gives up on the server (a
/// server that never ends a continue).
const MAX_CONTINUE_FRAMES: usize = 1 << 20;

impl<S: AsyncRead + AsyncWrite + Unpin> Client<S> {
    /// Sends RANGE_SCAN_CREATE for vBucket `vbid` with the JSON `spec`; a successful
    /// response's value is the 16-byte scan id.
    ///
    /// # Errors
    /// As [`Client::request`].
    pub async fn range_scan_create(&mut self, vbid: Vbid, spec: &[u8]) -> Result<Response> {
        self.request(RequestBuilder::from_command(&Command::RangeScanCreate { spec }).vbucket(vbid))
            .await
    }

    /// Sends RANGE_SCAN_CONTINUE and reads its responses up to and including the last
    /// (any status but Success: RangeScanMore, RangeScanComplete or an error).
    ///
    /// # Errors
    /// As [`Client::request`]; [`Error::Malformed`] when the server sends more than
    /// a million responses for one continue.
    pub async fn range_scan_continue(
        &mut self,
        vbid: Vbid,
        req: ContinueRequest,
    ) -> Result<Vec<Response>> {
        let opaque = self
            .send(RequestBuilder::from_command(&Command::RangeScanContinue(req)).vbucket(vbid))
            .await?;
        let mut out = Vec::new();
        for _ in 0..MAX_CONTINUE_FRAMES {
            let r = self.recv().await?;
            if r.opaque != opaque {
                return Err(Error::UnexpectedOpaque {
                    expected: opaque,
                    got: r.opaque,
                });
            }
            let last = r.status() != Some(Status::Success);
            out.push(r);
            if last {
                return Ok(out);
            }
        }
        Err(Error::Malformed("a range scan continue that never ends"))
    }

    /// Sends RANGE_SCAN_CANCEL.
    ///
    /// # Errors
    /// As [`Client::request`].
    pub async fn range_scan_cancel(&mut self, vbid: Vbid, id: [u8; 16]) -> Result<Response> {
        self.request(RequestBuilder::from_command(&Command::RangeScanCancel { id }).vbucket(vbid))
            .await
    }
}
