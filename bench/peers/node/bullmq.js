// The BullMQ side of BenchmarkBullMQ_Ratio: adds JOBS jobs to a queue (not
// timed), then times a Worker with CONCURRENCY from its start until it has
// completed them all, with a processor that returns at once or after
// DELAY_MS. BullMQ's defaults otherwise: one attempt a job, completed jobs
// kept, an event a state change. Prints {"jobs": n, "seconds": s,
// "setup_seconds": s, "redis_cpu_seconds": s}, the last redis-server's CPU
// over the timed part.
// Needs NODE_PATH holding bullmq (scripts/clients.sh --bench).
const { Queue, Worker } = require("bullmq");
const IORedis = require("ioredis");

const [port, jobs, concurrency, delayMs, name] = process.argv.slice(2);
const connection = { host: "127.0.0.1", port: Number(port) };
const total = Number(jobs);

async function main() {
  const setup = process.hrtime.bigint();
  const queue = new Queue(name, { connection });
  for (let i = 0; i < total; i += 1000) {
    const batch = [];
    for (let j = i; j < Math.min(i + 1000, total); j++) {
      batch.push({ name: "e", data: { user: "u" + String(j).padStart(6, "0"), n: j } });
    }
    await queue.addBulk(batch);
  }
  const wait = Number(delayMs);
  let done = 0;
  let finish;
  const finished = new Promise((resolve) => (finish = resolve));
  const client = new IORedis(connection); // for INFO cpu only
  const cpu0 = await serverCPU(client);
  const start = process.hrtime.bigint();
  const worker = new Worker(
    name,
    async () => {
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    },
    { connection, concurrency: Number(concurrency) },
  );
  worker.on("completed", () => {
    if (++done === total) finish();
  });
  worker.on("failed", (job, err) => {
    console.error("job failed:", err);
    process.exit(1);
  });
  await finished;
  const end = process.hrtime.bigint();
  const cpu = (await serverCPU(client)) - cpu0;
  await worker.close();
  await queue.obliterate({ force: true });
  await queue.close();
  client.disconnect();
  console.log(
    JSON.stringify({ jobs: done, seconds: Number(end - start) / 1e9, setup_seconds: Number(start - setup) / 1e9, redis_cpu_seconds: cpu }),
  );
}

// serverCPU is redis-server's CPU time so far (INFO cpu, user and system).
async function serverCPU(client) {
  const info = await client.info("cpu");
  let total = 0;
  for (const line of info.split("\r\n")) {
    const [k, v] = line.split(":");
    if (k === "used_cpu_user" || k === "used_cpu_sys") total += Number(v);
  }
  return total;
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
