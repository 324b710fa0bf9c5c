variable "name" {
  type        = string
  description = "Name prefix of every resource (cluster, tasks, schedules, roles)."
  default     = "silt"
}

variable "aws_region" {
  type        = string
  description = "AWS region of the ECS cluster and the schedules."
}

variable "image" {
  type        = string
  description = "Container image holding /usr/local/bin/worker and /usr/local/bin/archiver (built from the repository's Dockerfile)."
}

variable "subnet_ids" {
  type        = list(string)
  description = "Subnets the Fargate tasks run in; they must reach Redis and Tigris."
}

variable "security_group_ids" {
  type        = list(string)
  description = "Security groups of the Fargate tasks."
}

variable "assign_public_ip" {
  type        = bool
  description = "Give tasks a public IP (needed in public subnets without a NAT gateway)."
  default     = false
}

variable "tigris_endpoint" {
  type        = string
  description = "Tigris S3 endpoint."
  default     = "https://fly.storage.tigris.dev"
}

variable "tigris_access_key_id" {
  type        = string
  description = "Tigris access key id used by Terraform to create the bucket. Pass it with TF_VAR_tigris_access_key_id; never commit it."
  sensitive   = true
}

variable "tigris_secret_access_key" {
  type        = string
  description = "Tigris secret key used by Terraform to create the bucket. Pass it with TF_VAR_tigris_secret_access_key; never commit it."
  sensitive   = true
}

variable "bucket_name" {
  type        = string
  description = "Name of the Tigris bucket that holds the archive (globally unique)."
}

variable "archive_prefix" {
  type        = string
  description = "Key prefix of the archive inside the bucket."
  default     = "silt"
}

variable "redis_url_secret_arn" {
  type        = string
  description = "ARN of the Secrets Manager secret holding the Redis URL (rediss://user:password@host:port/0). The tasks read it at start; its value never appears in Terraform."
}

variable "tigris_keys_secret_arn" {
  type        = string
  description = "ARN of the Secrets Manager secret holding the tasks' Tigris keys as JSON {\"AWS_ACCESS_KEY_ID\": ..., \"AWS_SECRET_ACCESS_KEY\": ...}."
}

variable "queue" {
  type        = string
  description = "Queue (the hash tag of every key), SILT_QUEUE."
}

variable "stream" {
  type        = string
  description = "Stream the worker consumes, SILT_STREAM."
}

variable "group" {
  type        = string
  description = "Consumer group of the worker, SILT_GROUP."
}

variable "worker_handler" {
  type        = list(string)
  description = "Handler arguments of worker run, e.g. [\"--webhook\", \"https://api.example.org/events\"]."
}

variable "worker_schedule" {
  type        = string
  description = "EventBridge Scheduler expression of worker runs, e.g. rate(5 minutes)."
  default     = "rate(5 minutes)"
}

variable "worker_max_duration" {
  type        = string
  description = "Longest one worker run may take (worker run --max-duration); keep it below the schedule period."
  default     = "4m"
}

variable "archiver_schedule" {
  type        = string
  description = "EventBridge Scheduler expression of archiver runs, e.g. rate(1 hour)."
  default     = "rate(1 hour)"
}

variable "keep_for" {
  type        = string
  description = "Retention of the live stream (archiver run --keep-for); what is older is archived, then trimmed."
  default     = "24h"
}

variable "task_cpu" {
  type        = number
  description = "Fargate CPU units per task."
  default     = 256
}

variable "task_memory" {
  type        = number
  description = "Fargate memory (MiB) per task."
  default     = 512
}

variable "log_retention_days" {
  type        = number
  description = "Days CloudWatch keeps the tasks' logs."
  default     = 14
}
