// rhea (npm) as an AMQP 1.0 producer: send the scenario's messages ({subject, body}) to its
// address, one delivery each, and print one JSON line per message with the server's outcome
// ({"state": "accepted"} or {"state": "rejected", "condition", "description"}), in order.
"use strict";

const rhea = require("rhea");

const scenario = JSON.parse(process.argv[2]);
const outcomes = new Array(scenario.messages.length).fill(null);
let sent = 0;
let settled = 0;

function record(context, outcome) {
    outcomes[context.delivery.tag.readUInt32BE(0)] = outcome;
    settled += 1;
    if (settled === outcomes.length) {
        for (const line of outcomes) console.log(JSON.stringify(line));
        context.connection.close();
    }
}

const container = rhea.create_container({ id: "rhea-outcomes" });

container.on("sendable", (context) => {
    while (context.sender.sendable() && sent < scenario.messages.length) {
        const tag = Buffer.alloc(4);
        tag.writeUInt32BE(sent);
        context.sender.send(scenario.messages[sent], tag);
        sent += 1;
    }
});

container.on("accepted", (context) => record(context, { state: "accepted" }));

container.on("rejected", (context) => {
    const error = context.delivery.remote_state.error || {};
    record(context, {
        state: "rejected",
        condition: String(error.condition),
        description: error.description,
    });
});

container.on("connection_error", (context) => {
    console.error("connection error", String(context.connection.error));
    process.exit(1);
});

container
    .connect({
        host: "127.0.0.1",
        port: scenario.port,
        username: scenario.user,
        password: scenario.password,
        reconnect: false,
    })
    .open_sender({ target: { address: scenario.address }, autosettle: true });
