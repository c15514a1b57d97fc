package tidemesh_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	tidemesh "github.com/tidemesh/tidemesh/sdk/go"
)

// A file shared by one daemon and fetched by another through a real broker, with this SDK.
func TestFileShareListAndGet(t *testing.T) {
	w := startWorld(t, "team", []string{"alice", "bob"})
	ctx := context.Background()
	clientOf := func(label string) *tidemesh.Client {
		c, err := tidemesh.ForMesh("team", tidemesh.MeshOptions{
			Env: tidemesh.Env{"TIDEMESH_HOME": w.daemons[label].home}})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	alice, bob := clientOf("alice"), clientOf("bob")
	deadline := time.Now().Add(30 * time.Second)
	for {
		ha, _ := alice.Health(ctx)
		hb, _ := bob.Health(ctx)
		if ha != nil && hb != nil && ha["connected"] == true && hb["connected"] == true {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("daemons did not connect")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := bob.Membership(ctx, "topic", "subscribe", "ops", true); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(w.root, "notes.txt")
	data := bytes.Repeat([]byte("minutes "), 10000)
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	shared, err := alice.FileShare(ctx, src, "topic:ops", tidemesh.FileShareOptions{Message: "notes"})
	if err != nil {
		t.Fatal(err)
	}
	if shared.File.Size != int64(len(data)) || shared.SentChunks != shared.File.Chunks {
		t.Fatalf("shared %+v", shared)
	}
	for {
		files, err := bob.FileList(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == 1 && files[0].ID == shared.File.ID && files[0].Direction == "received" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never announced to bob: %+v", files)
		}
		time.Sleep(100 * time.Millisecond)
	}
	out := filepath.Join(w.root, "copy.txt")
	got, err := bob.FileGet(ctx, shared.File.ID, out)
	if err != nil {
		t.Fatal(err)
	}
	if back, _ := os.ReadFile(got.Path); !bytes.Equal(back, data) {
		t.Fatal("the copy differs")
	}
	stream, err := bob.FileStream(ctx, shared.File.ID)
	if err != nil {
		t.Fatal(err)
	}
	streamed, err := io.ReadAll(stream)
	stream.Close()
	if err != nil || !bytes.Equal(streamed, data) {
		t.Fatalf("the stream differs: %v", err)
	}
	if _, err := bob.FileStream(ctx, "ff"+shared.File.ID[2:]); err == nil {
		t.Fatal("an unknown file streamed")
	}
	_, err = bob.FileGet(ctx, "ff"+shared.File.ID[2:], out)
	var tmErr *tidemesh.Error
	if !errors.As(err, &tmErr) || tmErr.Status != 404 {
		t.Fatalf("an unknown file: %v", err)
	}
}
