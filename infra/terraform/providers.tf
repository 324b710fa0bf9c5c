# The AWS account that runs the scheduled tasks.
provider "aws" {
  region = var.aws_region
}

# Tigris speaks the S3 API: the same provider, pointed at Tigris's endpoint.
provider "aws" {
  alias      = "tigris"
  region     = "auto"
  access_key = var.tigris_access_key_id
  secret_key = var.tigris_secret_access_key

  endpoints {
    s3 = var.tigris_endpoint
  }

  skip_credentials_validation = true
  skip_region_validation      = true
  skip_requesting_account_id  = true
  skip_metadata_api_check     = true
}
