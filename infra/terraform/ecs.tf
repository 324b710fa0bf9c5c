locals {
  remote = "s3://${aws_s3_bucket.archive.bucket}/${var.archive_prefix}?endpoint=${var.tigris_endpoint}&region=auto"

  common_env = [
    { name = "SILT_QUEUE", value = var.queue },
    { name = "SILT_LOG_FORMAT", value = "json" },
    { name = "SILT_ARCHIVE_REMOTE", value = local.remote },
    { name = "SILT_DATA_DIR", value = "/tmp/silt-data" },
    { name = "SILT_ARCHIVE_CACHE", value = "/tmp/silt-cache" },
  ]

  # Secrets are passed by reference: ECS reads them when a task starts.
  secrets = [
    { name = "SILT_REDIS_URL", valueFrom = var.redis_url_secret_arn },
    { name = "AWS_ACCESS_KEY_ID", valueFrom = "${var.tigris_keys_secret_arn}:AWS_ACCESS_KEY_ID::" },
    { name = "AWS_SECRET_ACCESS_KEY", valueFrom = "${var.tigris_keys_secret_arn}:AWS_SECRET_ACCESS_KEY::" },
  ]
}

resource "aws_ecs_cluster" "this" {
  name = var.name
}

resource "aws_cloudwatch_log_group" "this" {
  name              = "/ecs/${var.name}"
  retention_in_days = var.log_retention_days
}

resource "aws_ecs_task_definition" "worker" {
  family                   = "${var.name}-worker"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.task_cpu
  memory                   = var.task_memory
  execution_role_arn       = aws_iam_role.execution.arn
  task_role_arn            = aws_iam_role.task.arn

  container_definitions = jsonencode([{
    name        = "worker"
    image       = var.image
    essential   = true
    stopTimeout = 30
    command = concat(["worker", "run", "--stream", var.stream, "--group", var.group,
    "--max-duration", var.worker_max_duration], var.worker_handler)
    environment = local.common_env
    secrets     = local.secrets
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        awslogs-group         = aws_cloudwatch_log_group.this.name
        awslogs-region        = var.aws_region
        awslogs-stream-prefix = "worker"
      }
    }
  }])
}

resource "aws_ecs_task_definition" "archiver" {
  family                   = "${var.name}-archiver"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.task_cpu
  memory                   = var.task_memory
  execution_role_arn       = aws_iam_role.execution.arn
  task_role_arn            = aws_iam_role.task.arn

  container_definitions = jsonencode([{
    name        = "archiver"
    image       = var.image
    essential   = true
    stopTimeout = 30
    command     = ["archiver", "run", "--all", "--keep-for", var.keep_for]
    environment = local.common_env
    secrets     = local.secrets
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        awslogs-group         = aws_cloudwatch_log_group.this.name
        awslogs-region        = var.aws_region
        awslogs-stream-prefix = "archiver"
      }
    }
  }])
}
