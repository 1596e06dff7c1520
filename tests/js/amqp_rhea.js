// rhea (npm) as an AMQP 1.0 client of futoin-evt: receive from `events` while sending
// `count` small messages and one of `big` characters to it; print one JSON line per message
// received, then {"accepted": n}.
"use strict";

const rhea = require("rhea");

const scenario = JSON.parse(process.argv[2]);
const total = scenario.count + 1;
const container = rhea.create_container({ id: "rhea-test" });
let accepted = 0;
let received = 0;
let sent = 0;

function done() {
    if (accepted === total && received === total) {
        console.log(JSON.stringify({ accepted }));
        connection.close();
    }
}

container.on("receiver_open", (context) => {
    context.connection.open_sender("events");
});

container.on("sendable", (context) => {
    while (context.sender.sendable() && sent < total) {
        const body = sent < scenario.count ? { n: sent } : "x".repeat(scenario.big);
        context.sender.send({ subject: "RHEA", body });
        sent += 1;
    }
});

container.on("accepted", () => {
    accepted += 1;
    done();
});

container.on("rejected", (context) => {
    console.error("rejected", JSON.stringify(context.delivery.remote_state));
    process.exit(1);
});

container.on("message", (context) => {
    const message = context.message;
    const body = typeof message.body === "string" ? { length: message.body.length } : message.body;
    console.log(JSON.stringify({ subject: message.subject, body }));
    received += 1;
    done();
});

container.on("connection_error", (context) => {
    console.error("connection error", String(context.connection.error));
    process.exit(1);
});

const connection = container.connect({
    host: "127.0.0.1",
    port: scenario.port,
    username: scenario.user,
    password: scenario.password,
    reconnect: false,
    max_frame_size: 16384,
});
connection.open_receiver({ source: "events", credit_window: 50 });
