# The two silt binaries in one small image: static build, non-root user.
#   docker build -t silt .
#   docker run --rm silt worker --help
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/worker ./cmd/archiver

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/worker /out/archiver /usr/local/bin/
ENV PATH=/usr/local/bin
USER nonroot:nonroot
WORKDIR /tmp
ENTRYPOINT []
