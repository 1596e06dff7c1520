// rhea (npm) sending keyed events to futoin-evt: `count` messages, each sent twice with the
// same application property `futoin-evt-key` (the second as a retry would be), in flight
// together; prints {"accepted": n} once every message is accepted.
"use strict";

const rhea = require("rhea");

const scenario = JSON.parse(process.argv[2]);
const total = 2 * scenario.count;
const container = rhea.create_container({ id: "rhea-keys" });
let accepted = 0;
let sent = 0;

container.on("sendable", (context) => {
    while (context.sender.sendable() && sent < total) {
        const n = sent % scenario.count;
        context.sender.send({
            subject: "RHEA",
            body: { n },
            application_properties: { "futoin-evt-key": `rhea:${n}` },
        });
        sent += 1;
    }
});

container.on("accepted", (context) => {
    accepted += 1;
    if (accepted === total) {
        console.log(JSON.stringify({ accepted }));
        context.connection.close();
    }
});

container.on("rejected", (context) => {
    console.error("rejected", JSON.stringify(context.delivery.remote_state));
    process.exit(1);
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
});
connection.open_sender("events");
