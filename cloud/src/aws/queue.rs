//! The interruption queue on SQS.

use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, MessageSystemAttributeName, SendMessageBatchRequestEntry};

use super::errors::from_code;
use crate::{BoxFuture, CloudError, InterruptionQueue, QueueMessage};

/// An SQS queue of EventBridge interruption events.
pub struct SqsQueue {
    sqs: Client,
    url: String,
    /// The visibility timeout each receive asks for (the queue's own when `None`).
    visibility: Option<Duration>,
}

fn sqs_error<E, R>(action: &str, err: SdkError<E, R>) -> CloudError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug,
{
    let message = err.message().map(str::to_string).unwrap_or_else(|| format!("{err:?}"));
    from_code(action, err.code(), &message)
}

impl SqsQueue {
    /// The queue at `url`, on the SDK configuration of [`super::sdk_config`].
    pub fn new(sdk: &aws_config::SdkConfig, url: &str) -> Self {
        SqsQueue { sqs: Client::new(sdk), url: url.to_string(), visibility: None }
    }

    /// The queue named `name` (GetQueueUrl).
    pub async fn named(sdk: &aws_config::SdkConfig, name: &str) -> Result<Self, CloudError> {
        let sqs = Client::new(sdk);
        let out = sqs.get_queue_url().queue_name(name).send().await.map_err(|e| sqs_error("GetQueueUrl", e))?;
        let url = out.queue_url().ok_or_else(|| CloudError::Invalid {
            what: format!("interruption queue {name}"),
            reason: "GetQueueUrl returned no URL".into(),
        })?;
        Ok(SqsQueue { sqs, url: url.to_string(), visibility: None })
    }

    /// Creates the queue named `name` (CreateQueue: the one of that name when it exists with
    /// the same attributes). For tests and the loadtest; the controller only finds queues.
    pub async fn create(sdk: &aws_config::SdkConfig, name: &str) -> Result<Self, CloudError> {
        let sqs = Client::new(sdk);
        let out = sqs.create_queue().queue_name(name).send().await.map_err(|e| sqs_error("CreateQueue", e))?;
        let url = out.queue_url().ok_or_else(|| CloudError::Invalid {
            what: format!("queue {name}"),
            reason: "CreateQueue returned no URL".into(),
        })?;
        Ok(SqsQueue { sqs, url: url.to_string(), visibility: None })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Sends `bodies` (SendMessageBatch, ten a call): what EventBridge does for EC2's events,
    /// for tests and the loadtest's forwarding. An entry the queue refused is an error.
    pub async fn send(&self, bodies: &[String]) -> Result<(), CloudError> {
        for chunk in bodies.chunks(10) {
            let entries: Vec<SendMessageBatchRequestEntry> = chunk
                .iter()
                .enumerate()
                .filter_map(|(i, b)| {
                    SendMessageBatchRequestEntry::builder().id(i.to_string()).message_body(b).build().ok()
                })
                .collect();
            let out = self
                .sqs
                .send_message_batch()
                .queue_url(&self.url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| sqs_error("SendMessageBatch", e))?;
            if let Some(f) = out.failed().first() {
                return Err(from_code("SendMessageBatch", Some(f.code()), f.message().unwrap_or_default()));
            }
        }
        Ok(())
    }

    /// Each receive hides its messages for `visibility` (whole seconds, at least 1), instead
    /// of the queue's default.
    pub fn with_visibility(mut self, visibility: Duration) -> Self {
        self.visibility = Some(visibility);
        self
    }
}

impl InterruptionQueue for SqsQueue {
    fn receive(&self, max: usize, wait: Duration) -> BoxFuture<'_, Result<Vec<QueueMessage>, CloudError>> {
        Box::pin(async move {
            let out = self
                .sqs
                .receive_message()
                .queue_url(&self.url)
                .max_number_of_messages(max.clamp(1, 10) as i32)
                .wait_time_seconds(wait.as_secs().min(20) as i32)
                .set_visibility_timeout(self.visibility.map(|v| v.as_secs().clamp(1, 43_200) as i32))
                .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
                .send()
                .await
                .map_err(|e| sqs_error("ReceiveMessage", e))?;
            Ok(out
                .messages()
                .iter()
                .filter_map(|m| {
                    Some(QueueMessage {
                        id: m.message_id()?.to_string(),
                        receipt: m.receipt_handle()?.to_string(),
                        body: m.body().unwrap_or_default().to_string(),
                        sent: m
                            .attributes()
                            .and_then(|a| a.get(&MessageSystemAttributeName::SentTimestamp))
                            .and_then(|t| t.parse().ok()),
                    })
                })
                .collect())
        })
    }

    fn delete<'a>(&'a self, receipts: &'a [String]) -> BoxFuture<'a, Result<(), CloudError>> {
        Box::pin(async move {
            for chunk in receipts.chunks(10) {
                let entries: Vec<DeleteMessageBatchRequestEntry> = chunk
                    .iter()
                    .enumerate()
                    .filter_map(|(i, r)| {
                        DeleteMessageBatchRequestEntry::builder().id(i.to_string()).receipt_handle(r).build().ok()
                    })
                    .collect();
                let out = self
                    .sqs
                    .delete_message_batch()
                    .queue_url(&self.url)
                    .set_entries(Some(entries))
                    .send()
                    .await
                    .map_err(|e| sqs_error("DeleteMessageBatch", e))?;
                // A receipt of a message already deleted is done, not an error.
                if let Some(f) = out.failed().iter().find(|f| f.code() != "ReceiptHandleIsInvalid") {
                    return Err(from_code("DeleteMessageBatch", Some(f.code()), f.message().unwrap_or_default()));
                }
            }
            Ok(())
        })
    }

    fn change_visibility<'a>(&'a self, receipt: &'a str, timeout: Duration) -> BoxFuture<'a, Result<(), CloudError>> {
        Box::pin(async move {
            self.sqs
                .change_message_visibility()
                .queue_url(&self.url)
                .receipt_handle(receipt)
                .visibility_timeout(timeout.as_secs().min(43_200) as i32)
                .send()
                .await
                .map_err(|e| sqs_error("ChangeMessageVisibility", e))?;
            Ok(())
        })
    }
}
