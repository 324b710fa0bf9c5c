package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
)

// ownGroup makes an exec handler the leader of its own process group, with
// SIGKILL as its parent-death signal, and makes cancelling the command
// (handler timeout, the end of --grace) kill the whole group: a handler
// never runs on beside the redelivery of its own entry.
//
// The death signal reaches only the child the worker started. A shell that
// forks its command rather than replacing itself (dash running a script)
// dies, and the script runs on. So a SIGKILLed worker leaves its handlers'
// groups to the reaper (below): a process of its own (a shell script, or
// the worker's binary where there is no sh) that holds the list of live
// handler groups and kills them all the moment the worker is gone.
func ownGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error {
		if cmd.Process == nil {
			return nil
		}
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}

// startOwned starts cmd in its own group (ownGroup) and hands the group to
// the reaper; release hands it back once cmd has been waited for.
func startOwned(cmd *exec.Cmd) (release func(), err error) {
	ownGroup(cmd)
	if noReaper {
		return func() {}, cmd.Start()
	}
	if err := reap.start(); err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	pgid := cmd.Process.Pid
	reap.send('+', pgid)
	return func() { reap.send('-', pgid) }, nil
}

// reaperScript is the reaper where there is a POSIX shell (the one `--exec`
// and `--pipe` commands run in): it keeps the live handler groups from its
// stdin, "+PGID" as one starts and "-PGID" as it ends, and at the end of
// its input (the worker exited or was killed) kills each group still
// listed with SIGKILL. Signals meant for the worker do not stop it. A
// shell starts in about a millisecond with 1-2 MB resident, where the
// worker's own binary (reaperMain, the fallback where there is no sh, as
// in a distroless image running `-- CMD` handlers) takes some 30 ms of
// CPU and 20 MB for its load and package init.
//
// A group id that is not a number above 1 is never killed: kill -KILL -1
// would signal every process the user may.
const reaperScript = `trap '' INT TERM HUP QUIT PIPE
live=' '
while IFS= read -r line; do
	g=${line#?}
	case $g in '' | *[!0-9]*) continue ;; esac
	case $line in
	+*) live="$live$g " ;;
	-*) case $live in *" $g "*) live="${live%% $g *} ${live#* $g }" ;; esac ;;
	esac
done
for g in $live; do
	[ "$g" -gt 1 ] && kill -KILL -"$g" 2>/dev/null
done
exit 0`

// reaperArg, as the only argument, makes the worker binary the reaper
// (reaperMain).
const reaperArg = "__silt-reaper"

// reaperCommand is the reaper's process: reaperScript under sh, or the
// worker's own binary where there is no sh. The script goes in the
// environment, so that ps shows `sh -c eval "$SILT_REAPER" silt-reaper`
// ($0 names it), not a dozen lines of shell.
func reaperCommand() *exec.Cmd {
	if sh, err := exec.LookPath("sh"); err == nil {
		cmd := exec.Command(sh, "-c", `eval "$SILT_REAPER"`, "silt-reaper")
		cmd.Env = append(os.Environ(), "SILT_REAPER="+reaperScript)
		return cmd
	}
	return exec.Command("/proc/self/exe", reaperArg)
}

// reaper is the worker's side of the reaper process: started once, on the
// first handler, and told each handler group as it starts ('+') and ends
// ('-'). Its stdin is a pipe only the worker holds: when the worker dies,
// however it dies, the kernel closes it, and the reaper kills every group
// still listed, then exits.
type reaper struct {
	once sync.Once
	mu   sync.Mutex
	w    io.WriteCloser
	err  error
}

var reap reaper

func (r *reaper) start() error {
	r.once.Do(func() {
		cmd := reaperCommand()
		// Its own group, so a terminal's ^C to the worker's group leaves
		// it to do its job.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Stderr = os.Stderr
		if r.w, r.err = cmd.StdinPipe(); r.err == nil {
			r.err = cmd.Start()
		}
		if r.err != nil {
			r.err = fmt.Errorf("start the handler reaper: %w", r.err)
			return
		}
		go cmd.Wait() // it exits when the worker closes the pipe
	})
	return r.err
}

func (r *reaper) send(op byte, pgid int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.w != nil {
		fmt.Fprintf(r.w, "%c%d\n", op, pgid)
	}
}

// reaperMain is the reaper process where there is no sh (reaperCommand):
// reaperScript's work, in Go.
func reaperMain(in io.Reader) int {
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGPIPE)
	live := map[int]bool{}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		line := sc.Text()
		if len(line) < 2 {
			continue
		}
		pgid, err := strconv.Atoi(line[1:])
		if err != nil || pgid <= 1 {
			continue
		}
		if line[0] == '+' {
			live[pgid] = true
		} else {
			delete(live, pgid)
		}
	}
	for pgid := range live {
		syscall.Kill(-pgid, syscall.SIGKILL)
	}
	return 0
}
