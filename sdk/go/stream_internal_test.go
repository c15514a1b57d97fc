package tidemesh

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParserAndCursorNoticesHaveNoIDAndMoveTheResumePoint(t *testing.T) {
	var p parser
	var items []Item
	text := ": keepalive\n\nid: 7\nevent: message\ndata: {\"body\":\"x\"}\n\n" +
		"event: cursor_ahead\ndata: {\"replay_from\": 1}\n\n"
	for _, line := range strings.SplitAfter(text, "\n") {
		it, ok, err := p.feed(line)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			it.Raw = nil
			items = append(items, it)
		}
	}
	want := []Item{
		{ID: 7, Type: "message", Data: map[string]any{"body": "x"}},
		{IsNotice: true, Type: "cursor_ahead", Data: map[string]any{"replay_from": float64(1)}},
	}
	if !reflect.DeepEqual(items, want) {
		t.Fatalf("%+v", items)
	}
	c := cursor{last: 7, valid: true}
	if c.admit(items[0]) {
		t.Fatal("an id already given is given again")
	}
	if !c.admit(items[1]) || c.last != 0 || c.headers()["Last-Event-ID"] != "0" {
		t.Fatalf("%+v", c)
	}
	var r reconnect
	if _, again := r.delay(); again {
		t.Fatal("a stream that never connected must fail at once")
	}
	r.succeeded()
	for _, want := range []time.Duration{50, 100, 200, 400, 800, 1000, 1000} {
		got, _ := r.delay()
		lo, hi := want*time.Millisecond*3/4, want*time.Millisecond*5/4
		if got < lo || got > hi {
			t.Fatalf("delay %v, want %v ±25%%", got, want*time.Millisecond)
		}
	}
}
