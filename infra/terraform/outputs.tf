output "bucket" {
  description = "The Tigris bucket holding the archive."
  value       = aws_s3_bucket.archive.bucket
}

output "archive_remote" {
  description = "The --remote / --archive-remote URL of the archive (no credentials in it)."
  value       = local.remote
}

output "cluster_arn" {
  description = "ECS cluster running the scheduled tasks."
  value       = aws_ecs_cluster.this.arn
}

output "worker_schedule_arn" {
  description = "EventBridge schedule of worker runs."
  value       = aws_scheduler_schedule.worker.arn
}

output "archiver_schedule_arn" {
  description = "EventBridge schedule of archiver runs."
  value       = aws_scheduler_schedule.archiver.arn
}

output "log_group" {
  description = "CloudWatch log group of both tasks (JSON logs; run summaries on stdout)."
  value       = aws_cloudwatch_log_group.this.name
}
