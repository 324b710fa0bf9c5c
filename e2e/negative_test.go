package e2e

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// negativeControls each break one promise on purpose with a build tag; the
// scenario that guards the promise must then fail, with the checker's words.
var negativeControls = []struct {
	tag, pkg, run, want string
}{
	// The worker acks a batch before its handlers run; killed after the read,
	// the acked entries are never handled.
	{"silt_negative_ack", "./e2e", "^TestWorker_CrashAtEachPoint$/^after-read$", "at least once broken"},
	// In-flight entries are never renewed: a peer steals a live worker's
	// work in progress once its handlers outlast MinIdle.
	{"silt_negative_lease", "./pkg/stream", "^TestConsumer_LiveWorkerKeepsItsEntriesFromPeers$", "work in progress stolen"},
	// The archiver trims by the remote's watermark without proving the
	// history is this stream's: a second Redis sharing the bucket loses
	// its stream.
	{"silt_negative_proof", "./pkg/archive", "^TestArchive_SharedPrefixIsRefused$", "run on the second Redis"},
	// The same broken archiver under the seeded fault schedules: it commits
	// and trims on rolled-back, forged and foreign remotes.
	{"silt_negative_proof", "./e2e", "^TestFaultSchedule$", "exited 0 on a remote with"},
	// Trims and reads believe Redis's record: after a split brain the
	// promoted replica's entries below the remote's W are hidden, then
	// trimmed unarchived.
	{"silt_negative_compare", "./e2e", "^TestFailover_SplitBrainKeepsEveryReceipt$", "not read exactly once"},
	// The same build over a watermark forged on the remote and in the
	// record alike: 26 live unarchived entries trimmed.
	{"silt_negative_compare", "./pkg/archive", "^TestHolds_ForgedRecordAndWatermarkTrimNothingUnarchived$", "want 26 kept"},
	// No handler reaper: a SIGKILLed worker leaves the processes of a
	// script that dash forked (and of co-processes) running.
	{"silt_negative_reaper", "./e2e", "^TestWorker_NoHandlerOutlivesAKilledWorker$", "outlived their SIGKILLed worker"},
	// A first start's record is taken as written before it is: a worker
	// killed as the handler starts loses the start.
	{"silt_negative_sent", "./pkg/stream", "^TestConsumer_StartCountedWhenKilledAsTheHandlerStarts$", "start not counted"},
	// A 412 is taken for a lost race without reading the object back.
	{"silt_negative_readback", "./pkg/fence/s3", "^TestS3_LostReplyVerdict$", "got the wrong verdict"},
	// The page checksum is skipped: a corrupt page read by range goes through.
	{"silt_negative_checksum", "./pkg/graft", "^TestVolume_CorruptPageReadByRangeIsNamed$", "flipped page reads"},
}

// TestNegativeControls runs each guarding scenario against its broken build
// and expects it to fail: a checker that cannot fail proves nothing. (The
// archiver that trims above the watermark has its own test,
// TestArchiver_NegativeControlTrimAboveW.)
func TestNegativeControls(t *testing.T) {
	for _, nc := range negativeControls {
		t.Run(strings.TrimPrefix(nc.tag, "silt_negative_")+"/"+strings.Trim(nc.run, "^$"), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "go", "test", "-count=1", "-tags", nc.tag, "-run", nc.run, nc.pkg)
			cmd.Dir = ".."
			cmd.Env = append(withoutReport(os.Environ()), "SILT_BUILD_TAGS="+nc.tag)
			out, err := cmd.CombinedOutput()
			red := err != nil && strings.Contains(string(out), nc.want)
			report(t, scenario{Name: "negative control " + nc.tag, Runs: 1, Faults: 1, Detected: b2i(red)})
			if !red {
				t.Fatalf("%s did not turn %s %s red with %q (err %v):\n%s", nc.tag, nc.pkg, nc.run, nc.want, err, out)
			}
		})
	}
}

// withoutReport drops SILT_RELIABILITY_REPORT, so broken builds report nothing.
func withoutReport(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, "SILT_RELIABILITY_REPORT=") {
			out = append(out, kv)
		}
	}
	return out
}
