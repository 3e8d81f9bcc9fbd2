// Userspace network helpers for the network-namespace tests (tests/support/netns.rs), run with the
// node binary `localstack/up` installs, inside a test namespace through `ip netns exec`:
//
//   node netproxy.js relay SOCKET HOST PORT
//     Listens on the Unix socket SOCKET and forwards each connection to HOST:PORT. The test
//     process (root namespace) reaches a service inside a namespace through it: Unix sockets live
//     in the file system, so no address of the test range ever appears outside its namespaces.
//
//   node netproxy.js fault LISTEN_PORT HOST PORT DELAY_MS JITTER_MS LOSS_PERCENT RTO_MS STATS_FILE
//     Listens on 127.0.0.1:LISTEN_PORT of its namespace and forwards to HOST:PORT. Every chunk, in
//     each direction, is held DELAY_MS +- JITTER_MS (uniform) before it is passed on, in order.
//     With probability LOSS_PERCENT a chunk counts as a lost segment: it is held RTO_MS more, what
//     TCP's retransmission costs when a segment is dropped (the kernel here has no netem qdisc and
//     no tc actions, so packets cannot be dropped for real). Counts go to STATS_FILE (JSON) every
//     200 ms: connections, chunks, bytes, lost (chunks that paid the RTO), delay_ms_sum.
'use strict';
const net = require('net');
const fs = require('fs');

const [mode, ...args] = process.argv.slice(2);

function pipeBoth(a, b) {
  a.on('error', () => b.destroy());
  b.on('error', () => a.destroy());
  a.on('close', () => b.destroy());
  b.on('close', () => a.destroy());
}

if (mode === 'relay') {
  const [sock, host, port] = args;
  try { fs.unlinkSync(sock); } catch (_) { /* absent */ }
  net.createServer((c) => {
    const u = net.connect(Number(port), host);
    c.pipe(u);
    u.pipe(c);
    pipeBoth(c, u);
  }).listen(sock, () => console.log(`relay ${sock} -> ${host}:${port}`));
} else if (mode === 'fault') {
  const [listenPort, host, port, delay, jitter, loss, rto, statsFile] = args;
  const d = Number(delay), j = Number(jitter), p = Number(loss) / 100, r = Number(rto);
  const stats = { connections: 0, chunks: 0, bytes: 0, lost: 0, delay_ms_sum: 0 };
  const hold = () => {
    let ms = d + (Math.random() * 2 - 1) * j;
    if (Math.random() < p) {
      stats.lost += 1;
      ms += r;
    }
    return Math.max(0, ms);
  };
  // One direction: chunks leave in arrival order, each no earlier than its own hold time.
  const forward = (from, to) => {
    let last = 0;
    from.on('data', (chunk) => {
      const ms = hold();
      stats.chunks += 1;
      stats.bytes += chunk.length;
      stats.delay_ms_sum += ms;
      const at = Math.max(last, Date.now() + ms);
      last = at;
      setTimeout(() => { if (!to.destroyed) to.write(chunk); }, at - Date.now());
    });
    from.on('end', () => {
      setTimeout(() => to.end(), Math.max(0, last - Date.now()));
    });
  };
  net.createServer((c) => {
    stats.connections += 1;
    const u = net.connect(Number(port), host);
    forward(c, u);
    forward(u, c);
    c.on('error', () => u.destroy());
    u.on('error', () => c.destroy());
    c.on('close', () => setTimeout(() => u.destroy(), Math.max(0, d + j + r)));
    u.on('close', () => setTimeout(() => c.destroy(), Math.max(0, d + j + r)));
  }).listen(Number(listenPort), '127.0.0.1', () => console.log(`fault proxy 127.0.0.1:${listenPort} -> ${host}:${port}`));
  setInterval(() => fs.writeFileSync(statsFile, JSON.stringify(stats)), 200);
} else {
  console.error('usage: netproxy.js relay SOCKET HOST PORT | fault LISTEN_PORT HOST PORT DELAY_MS JITTER_MS LOSS_PERCENT RTO_MS STATS_FILE');
  process.exit(2);
}
