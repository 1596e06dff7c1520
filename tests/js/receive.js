'use strict';
// Receives pushed events with the official ReliableReceiver or LiveReceiver.
// Usage: node receive.js '{"endpoint": ..., "credentials": ..., "live": false,
//                          "component": "C", "want": null, "count": 100}'
// Prints {"ready": true} once readyToReceive returned, then one line per event
// {"id": ..., "type": ...}, and exits after `count` events.

const { AdvancedCCM } = require( 'futoin-invoker' );
const ReliableReceiver = require( 'futoin-eventstream/ReliableReceiver' );
const LiveReceiver = require( 'futoin-eventstream/LiveReceiver' );

const opts = JSON.parse( process.argv[2] );
const ccm = new AdvancedCCM();
const receiver = new ( opts.live ? LiveReceiver : ReliableReceiver )( ccm );
let received = 0;

receiver.on( 'ready', () => process.stdout.write( JSON.stringify( { ready: true } ) + '\n' ) );
receiver.on( 'workerError', ( err, info ) => process.stderr.write( `workerError ${err} ${info}\n` ) );
receiver.on( 'newEvents', ( events ) => {
    const lines = events.map( ( e ) => JSON.stringify( { id: e.id, type: e.type } ) + '\n' );
    received += events.length;
    const done = received >= opts.count;
    process.stdout.write( lines.join( '' ), () => {
        if ( done ) {
            receiver.stop();
            ccm.close();
            process.exit( 0 );
        }
    } );
} );

const start = { component: opts.component };
if ( opts.want ) {
    start.want = opts.want;
}
receiver.start( opts.endpoint, opts.credentials, start );
