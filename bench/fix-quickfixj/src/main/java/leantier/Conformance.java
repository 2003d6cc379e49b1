package leantier;

import java.io.FileOutputStream;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.Base64;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.time.LocalDateTime;

import quickfix.Application;
import quickfix.DefaultMessageFactory;
import quickfix.FileStoreFactory;
import quickfix.FieldNotFound;
import quickfix.Message;
import quickfix.ScreenLogFactory;
import quickfix.Session;
import quickfix.SessionID;
import quickfix.SessionSettings;
import quickfix.SocketInitiator;
import quickfix.field.*;
import quickfix.fix44.NewOrderSingle;
import quickfix.fix44.OrderCancelReplaceRequest;
import quickfix.fix44.OrderCancelRequest;

/**
 * A QuickFIX/J 2.3.2 initiator that trades with `leantier exchange serve --fix-listen`.
 * Phase 1: logon, new order, replace, a crossing order (fills on both sides), cancel, then an
 * order sent as the connection is dropped: after the automatic reconnect the report must
 * arrive (live, or through the resend that the sequence gap triggers). Phase 2 (run against a
 * restarted server over the same stores): logon with the persisted sequence numbers, trade.
 * QuickFIX/J validates every message it receives against its FIX 4.4 dictionary.
 * With -Dleantier.tls.ca=CA.pem the initiator connects over TLS (its SSL filter, SocketUseSSL),
 * trusting only that CA and checking the server's certificate names the host; with
 * -Dleantier.tls.cert=CERT.pem and -Dleantier.tls.key=KEY.pem (PKCS#8, EC) it presents that
 * client certificate. The PEM files become PKCS#12 stores in STORE_DIR, as QuickFIX/J reads.
 * Usage: Conformance HOST PORT STORE_DIR PASSWORD PHASE
 */
public final class Conformance implements Application {
    private static final long WAIT_S = 30;
    private final BlockingQueue<Message> reports = new LinkedBlockingQueue<>();
    private final Semaphore logons = new Semaphore(0);
    private final String password;

    private Conformance(String password) {
        this.password = password;
    }

    @Override public void onCreate(SessionID id) {}
    @Override public void onLogon(SessionID id) { logons.release(); }
    @Override public void onLogout(SessionID id) {}
    @Override public void toApp(Message message, SessionID id) {}
    @Override public void fromAdmin(Message message, SessionID id) {}
    @Override public void fromApp(Message message, SessionID id) { reports.add(message); }

    @Override
    public void toAdmin(Message message, SessionID id) {
        try {
            if (MsgType.LOGON.equals(message.getHeader().getString(MsgType.FIELD))) {
                message.setString(Password.FIELD, password);
            }
        } catch (FieldNotFound e) {
            throw new IllegalStateException(e);
        }
    }

    private static void check(boolean ok, String what) {
        if (!ok) {
            System.err.println("CONFORMANCE FAILED: " + what);
            System.exit(1);
        }
    }

    private Message next(String what) throws InterruptedException {
        Message message = reports.poll(WAIT_S, TimeUnit.SECONDS);
        check(message != null, "no message within " + WAIT_S + " s: " + what);
        return message;
    }

    /** The next ExecutionReport for ClOrdID `clOrdId` with ExecType `execType`. */
    private Message expect(String clOrdId, char execType) throws Exception {
        Message report = next("ExecType " + execType + " for " + clOrdId);
        String type = report.getHeader().getString(MsgType.FIELD);
        check(type.equals(MsgType.EXECUTION_REPORT), "expected an ExecutionReport, got " + report);
        check(report.getString(ClOrdID.FIELD).equals(clOrdId) && report.getChar(ExecType.FIELD) == execType,
            "expected ExecType " + execType + " for " + clOrdId + ", got " + report);
        return report;
    }

    private static NewOrderSingle order(String clOrdId, char side, double qty, double price) {
        NewOrderSingle order = new NewOrderSingle(new ClOrdID(clOrdId), new Side(side),
            new TransactTime(LocalDateTime.now()), new OrdType(OrdType.LIMIT));
        order.set(new Symbol("1"));
        order.set(new OrderQty(qty));
        order.set(new Price(price));
        return order;
    }

    private static OrderCancelRequest cancel(String orig, String clOrdId, char side) {
        OrderCancelRequest cancel = new OrderCancelRequest(new OrigClOrdID(orig), new ClOrdID(clOrdId),
            new Side(side), new TransactTime(LocalDateTime.now()));
        cancel.set(new Symbol("1"));
        return cancel;
    }

    private void phase1(SessionID id, SocketInitiator initiator) throws Exception {
        Session.sendToTarget(order("c1", Side.BUY, 10, 101000), id);
        Message accepted = expect("c1", ExecType.NEW);
        check(accepted.getDouble(LeavesQty.FIELD) == 10 && accepted.getChar(OrdStatus.FIELD) == OrdStatus.NEW, "c1 new: " + accepted);
        OrderCancelReplaceRequest replace = new OrderCancelReplaceRequest(new OrigClOrdID("c1"), new ClOrdID("c2"),
            new Side(Side.BUY), new TransactTime(LocalDateTime.now()), new OrdType(OrdType.LIMIT));
        replace.set(new Symbol("1"));
        replace.set(new OrderQty(8));
        replace.set(new Price(101005));
        Session.sendToTarget(replace, id);
        Message replaced = expect("c2", ExecType.REPLACED);
        check(replaced.getString(OrigClOrdID.FIELD).equals("c1"), "replace names c1: " + replaced);
        Session.sendToTarget(order("s1", Side.SELL, 3, 101005), id);
        expect("s1", ExecType.NEW);
        Message sold = expect("s1", ExecType.TRADE);
        check(sold.getChar(OrdStatus.FIELD) == OrdStatus.FILLED && sold.getDouble(LastQty.FIELD) == 3, "s1 filled: " + sold);
        Message bought = expect("c2", ExecType.TRADE);
        check(bought.getDouble(CumQty.FIELD) == 3 && bought.getDouble(LeavesQty.FIELD) == 5
            && bought.getDouble(AvgPx.FIELD) == 101005, "c2 partially filled: " + bought);
        Session.sendToTarget(cancel("c2", "c3", Side.BUY), id);
        Message cancelled = expect("c3", ExecType.CANCELED);
        check(cancelled.getChar(OrdStatus.FIELD) == OrdStatus.CANCELED, "c3 cancelled: " + cancelled);
        // Drop the connection right behind an order; QuickFIX/J reconnects by itself.
        Session.sendToTarget(order("d1", Side.BUY, 1, 101000), id);
        Session.lookupSession(id).disconnect("conformance: dropping the connection mid-stream", false);
        check(logons.tryAcquire(WAIT_S, TimeUnit.SECONDS), "logged on again after the drop");
        expect("d1", ExecType.NEW);
        Session.sendToTarget(cancel("d1", "d2", Side.BUY), id);
        expect("d2", ExecType.CANCELED);
    }

    private void phase2(SessionID id) throws Exception {
        Session.sendToTarget(order("e1", Side.SELL, 2, 101000), id);
        expect("e1", ExecType.NEW);
        Session.sendToTarget(cancel("e1", "e2", Side.SELL), id);
        expect("e2", ExecType.CANCELED);
    }

    private static final String STORE_PASSWORD = "conformance";

    private static Certificate[] certificates(String pem) throws Exception {
        try (InputStream in = Files.newInputStream(Path.of(pem))) {
            return CertificateFactory.getInstance("X.509").generateCertificates(in).toArray(new Certificate[0]);
        }
    }

    private static PrivateKey privateKey(String pem) throws Exception {
        String base64 = Files.readString(Path.of(pem)).replaceAll("-----[A-Z ]+-----", "").replaceAll("\\s", "");
        byte[] der = Base64.getDecoder().decode(base64);
        return KeyFactory.getInstance("EC").generatePrivate(new PKCS8EncodedKeySpec(der));
    }

    private static String store(KeyStore keys, String dir, String name) throws Exception {
        Files.createDirectories(Path.of(dir));
        String path = Path.of(dir, name).toString();
        try (FileOutputStream out = new FileOutputStream(path)) {
            keys.store(out, STORE_PASSWORD.toCharArray());
        }
        return path;
    }

    /** The SSL settings for the TLS the system properties ask for (none without leantier.tls.ca). */
    private static String[][] tlsSettings(String dir) throws Exception {
        String ca = System.getProperty("leantier.tls.ca");
        if (ca == null) {
            return new String[0][];
        }
        KeyStore trust = KeyStore.getInstance("PKCS12");
        trust.load(null, null);
        trust.setCertificateEntry("ca", certificates(ca)[0]);
        KeyStore own = KeyStore.getInstance("PKCS12");
        own.load(null, null);
        String cert = System.getProperty("leantier.tls.cert");
        if (cert != null) {
            own.setKeyEntry("client", privateKey(System.getProperty("leantier.tls.key")),
                STORE_PASSWORD.toCharArray(), certificates(cert));
        }
        return new String[][] {
            {"SocketUseSSL", "Y"}, {"EndpointIdentificationAlgorithm", "HTTPS"},
            {"SocketTrustStore", store(trust, dir, "trust.p12")}, {"TrustStoreType", "PKCS12"},
            {"SocketTrustStorePassword", STORE_PASSWORD},
            {"SocketKeyStore", store(own, dir, "own.p12")}, {"KeyStoreType", "PKCS12"},
            {"SocketKeyStorePassword", STORE_PASSWORD},
        };
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 5) {
            System.err.println("usage: Conformance HOST PORT STORE_DIR PASSWORD PHASE");
            System.exit(2);
        }
        SessionID id = new SessionID("FIX.4.4", "QFJ", "LEANTIER");
        SessionSettings settings = new SessionSettings();
        String[][] values = {
            {"ConnectionType", "initiator"}, {"SocketConnectHost", args[0]}, {"SocketConnectPort", args[1]},
            {"FileStorePath", args[2]}, {"HeartBtInt", "5"}, {"ReconnectInterval", "1"},
            {"StartTime", "00:00:00"}, {"EndTime", "00:00:00"}, {"NonStopSession", "Y"},
            {"UseDataDictionary", "Y"}, {"DataDictionary", "FIX44.xml"},
            {"ScreenLogShowEvents", "Y"}, {"ScreenLogShowIncoming", "N"}, {"ScreenLogShowOutgoing", "N"},
        };
        for (String[] value : values) {
            settings.setString(id, value[0], value[1]);
        }
        for (String[] value : tlsSettings(args[2])) {
            settings.setString(id, value[0], value[1]);
        }
        Conformance app = new Conformance(args[3]);
        SocketInitiator initiator = new SocketInitiator(app, new FileStoreFactory(settings), settings,
            new ScreenLogFactory(settings), new DefaultMessageFactory());
        initiator.start();
        check(app.logons.tryAcquire(WAIT_S, TimeUnit.SECONDS), "logon within " + WAIT_S + " s");
        if (args[4].equals("1")) {
            app.phase1(id, initiator);
        } else {
            app.phase2(id);
        }
        initiator.stop();
        System.out.println("CONFORMANCE PHASE " + args[4] + " OK");
        System.exit(0);
    }
}
