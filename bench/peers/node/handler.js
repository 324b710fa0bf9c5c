// The silt side's co-process for `worker run --pipe` in
// BenchmarkBullMQ_Ratio: answers each delivery ok, at once or after
// DELAY_MS (argv), each answer written as one line at once (docs/pipe.md).
const readline = require("readline");

const wait = Number(process.argv[2] || 0);
const rl = readline.createInterface({ input: process.stdin });
rl.on("line", (line) => {
  const { id } = JSON.parse(line);
  const answer = () => process.stdout.write(JSON.stringify({ id, ok: true }) + "\n");
  if (wait > 0) setTimeout(answer, wait);
  else answer();
});
