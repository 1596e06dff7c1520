// The AMQP load of `python -m bench.amqp --client rhea`, in a node process of its own:
// produce: `count` messages with `window` unsettled, timed until all are accepted;
// consume: `count` messages with `window` credit (accepted as they come), timed until all
// are in. Prints {"rate": messages per second}.
"use strict";

const rhea = require("rhea");

const s = JSON.parse(process.argv[2]);
const container = rhea.create_container({ id: "bench-rhea" });
const body = JSON.stringify({ order: 1, item: "x".repeat(40), qty: 3, price: 9.99 });
let started = 0;
let sent = 0;
let done = 0;

function finish() {
    const seconds = (process.hrtime.bigint() - started) / 1000n;
    console.log(JSON.stringify({ rate: s.count / (Number(seconds) / 1e6) }));
    connection.close();
}

container.on("sendable", (context) => {
    while (context.sender.sendable() && sent < s.count && sent - done < s.window) {
        const message = { subject: "ORDER", body: { n: sent, data: body } };
        if (s.durable) message.durable = true;
        context.sender.send(message);
        sent += 1;
    }
});
container.on("accepted", (context) => {
    done += 1;
    if (done === s.count) finish();
    else if (context.sender.sendable()) container.emit("sendable", context);
});
container.on("rejected", (context) => {
    console.error("rejected", JSON.stringify(context.delivery.remote_state));
    process.exit(1);
});
container.on("message", () => {
    done += 1;
    if (done === s.count) finish();
});
container.on("connection_error", (context) => {
    console.error("connection error", String(context.connection.error));
    process.exit(1);
});

const connection = container.connect({
    host: s.host, port: s.port, username: s.user, password: s.password, reconnect: false,
});
connection.on("connection_open", () => {
    started = process.hrtime.bigint();
    if (s.mode === "produce") {
        connection.open_sender({ target: { address: s.address, durable: s.durable ? 2 : 0 } });
    } else {
        const source = { address: s.address, durable: s.durable ? 2 : 0 };
        if (s.earliest) {
            const t = rhea.types;
            source.filter = {
                f: t.wrap_described(
                    t.wrap_map({ "event-streams-offset": t.wrap_symbol("@earliest") }, t.wrap_symbol),
                    0x200,
                ),
            };
        }
        connection.open_receiver({ source, credit_window: s.window });
    }
});
