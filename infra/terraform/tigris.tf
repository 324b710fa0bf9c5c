# The archive's bucket. silt sends X-Tigris-Consistent: true on every request
# to a *.tigris.dev endpoint, so conditional writes (the commit fence) and
# reads are decided on the object's leader: globally strong, whatever the
# bucket's location type. The archiver probes the fence at every start.
resource "aws_s3_bucket" "archive" {
  provider = aws.tigris
  bucket   = var.bucket_name
}
