package tidemesh

import (
	"context"
	"io"
	"net/url"
	"path/filepath"
	"strconv"
	"time"
)

// FileTimeout bounds FileShare and FileGet, which answer once the whole file has moved.
const FileTimeout = time.Hour

// SharedFile is a file as the daemon describes it (docs/ipc.md, "Files").
type SharedFile struct {
	ID         string `json:"id"`
	Name       string `json:"name"`
	Size       int64  `json:"size"`
	SHA256     string `json:"sha256"`
	ChunkSize  int    `json:"chunk_size"`
	Chunks     int    `json:"chunks"`
	Persistent bool   `json:"persistent"`
	Sealed     bool   `json:"sealed"`
}

// FileShareOptions are the optional parts of FileShare.
type FileShareOptions struct {
	Message    string // the announcement's text; "": the file's name
	Persistent bool   // kept by the broker past files.retention_days
}

// FileShareResult is POST /v1/file/share's answer.
type FileShareResult struct {
	File         SharedFile `json:"file"`
	Announcement SendResult `json:"announcement"`
	ResumedFrom  int        `json:"resumed_from"`
	SentChunks   int        `json:"sent_chunks"`
}

// FileGetResult is GET /v1/file/get's answer when the file was written to out.
type FileGetResult struct {
	File        SharedFile `json:"file"`
	Path        string     `json:"path"`
	ResumedFrom int        `json:"resumed_from"`
}

// FileEntry is one file of FileList: shared by this member or announced to it.
type FileEntry struct {
	SharedFile
	Direction string      `json:"direction"`
	From      string      `json:"from"`
	To        Destination `json:"to"`
	Message   *string     `json:"message"`
	CreatedAt int64       `json:"created_at"`
}

// FileShare uploads the file at path (made absolute) and announces it to to ("topic:NAME",
// "dm:PUBKEYHEX", "queue:NAME"); a retry of the same file to the same to resumes a cut-off
// upload and is announced once.
func (c *Client) FileShare(ctx context.Context, path, to string, opts FileShareOptions,
) (FileShareResult, error) {
	var out FileShareResult
	abs, err := filepath.Abs(path)
	if err != nil {
		return out, err
	}
	body := map[string]any{"path": abs, "to": to}
	if opts.Message != "" {
		body["message"] = opts.Message
	}
	if opts.Persistent {
		body["persistent"] = true
	}
	return out, c.callWith(ctx, c.files, FileTimeout, "POST", "/v1/file/share", body, nil, &out)
}

// FileGet fetches file id to out (made absolute), verified by its SHA-256 before out exists;
// a get that was cut off resumes when asked again with the same out.
func (c *Client) FileGet(ctx context.Context, id, out string) (FileGetResult, error) {
	var got FileGetResult
	abs, err := filepath.Abs(out)
	if err != nil {
		return got, err
	}
	q := url.Values{"id": {id}, "out": {abs}}
	return got, c.callWith(ctx, c.files, FileTimeout, "GET", "/v1/file/get?"+q.Encode(), nil,
		nil, &got)
}

// FileList is the files this member shared or was announced, newest first (limit 0: 100).
func (c *Client) FileList(ctx context.Context, limit int) ([]FileEntry, error) {
	if limit <= 0 {
		limit = 100
	}
	var out struct {
		Files []FileEntry `json:"files"`
	}
	err := c.call(ctx, "GET", "/v1/file/list?limit="+strconv.Itoa(limit), nil, nil, &out)
	return out.Files, err
}

// FileStream is file id's bytes, verified by the daemon before the first one comes; the
// caller reads and closes it. ctx bounds the whole read.
func (c *Client) FileStream(ctx context.Context, id string) (io.ReadCloser, error) {
	resp, err := c.openWith(ctx, c.files, "GET", "/v1/file/get?"+url.Values{"id": {id}}.Encode(),
		nil, nil)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			return nil, c.Endpoint.notRunning(err)
		}
		return nil, FromBody(resp.StatusCode, raw)
	}
	return resp.Body, nil
}
